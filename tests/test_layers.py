"""The package's layers as rules on its imports, read from the source (ast; nothing imported).

vrag_rollout: `core/` is pure (no engine, no retriever, no vllm, no HTTP library); `formats/`
(one module per action format) only `core/`; only `engine/` imports vllm; `verify/` imports only `verify/`; `retrieval/` imports nothing of the
episode logic, the engine or the rollout; `training/` (the policy update) only `core/`; `evaluation/` (scoring) only `core/`; nothing
below `rollout/` imports it; no import cycle.
retriever_server, lowest layer first: `contract` (the wire contract) imports nothing; `storage/`
(the index on disk) only itself; `encoders/` only itself; `backends/` storage and encoders;
`indexing/` (building an index) those and never serving or HTTP; `serving/` (requests without
HTTP) storage, backends and the contract; `api/` (the HTTP surface) serving and below, never
indexing; only `cli` and `api/` import `api/`; `sample_corpus` imports nothing; no HTTP library
below `api/`; no import cycle.
Each rule is also shown to fail on a planted violation, so the checker itself can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTTP = ("urllib3", "aiohttp", "requests", "httpx", "fastapi", "uvicorn", "starlette")


def import_graph(package: str) -> dict[str, set[str]]:
    """module -> every module or name it imports (relative imports resolved), at any depth of
    the file (imports inside functions count: a layer rule is about what a module may use)."""
    graph = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        home = module if is_package else module.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = home.split(".")[: len(home.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                found.add(target)
                found |= {f"{target}.{alias.name}" for alias in node.names}
        graph[module] = found
    return graph


def modules_imported(graph: dict[str, set[str]], module: str) -> set[str]:
    """The package modules `module` imports (names inside a module count as that module)."""
    known = set(graph)
    out = set()
    for name in graph[module]:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            out.add(name)
    return out


def in_layer(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


def violations(graph: dict[str, set[str]], package: str, rules: list[tuple]) -> list[str]:
    """(layer, allowed package layers or None, forbidden top-level libraries) per rule."""
    found = []
    for layer, allowed, forbidden in rules:
        for module in graph:
            if not in_layer(module, f"{package}.{layer}"):
                continue
            for target in modules_imported(graph, module):
                if allowed is not None and not any(in_layer(target, f"{package}.{a}" if a else package)
                                                   for a in allowed):
                    if target != package:
                        found.append(f"{module} imports {target}")
            for name in graph[module]:
                if name.split(".")[0] in forbidden:
                    found.append(f"{module} imports {name}")
    return found


def library_users(graph: dict[str, set[str]], library: str) -> set[str]:
    return {m for m, names in graph.items() if any(n.split(".")[0] == library for n in names)}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles between modules (package __init__ re-exports of their own children excluded)."""
    edges = {m: {t for t in modules_imported(graph, m) if not m.startswith(t + ".")} for m in graph}
    found, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(edges[module]):
            if state.get(target) == "open":
                found.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    return found


LEAVES = ("config", "protocol", "families", "logit_bias", "turn_output", "progress")  # top-level modules every layer may use
ROLLOUT_RULES = [
    ("core", ["core", *LEAVES], ("vllm", "retriever_server", *HTTP)),
    ("engine", ["engine", *LEAVES], ()),
    ("formats", ["formats", "core", *LEAVES], ("vllm", "retriever_server", *HTTP)),
    ("retrieval", ["retrieval"], ("vllm",)),
    ("verify", ["verify"], ("vllm", "retriever_server")),
    ("training", ["training", "core", *LEAVES], ("vllm", "retriever_server", *HTTP)),
    ("evaluation", ["evaluation", "core", *LEAVES], ("vllm", "retriever_server", *HTTP)),
]
SERVER_RULES = [
    ("contract", [], ()),
    ("storage", ["storage"], HTTP),
    ("encoders", ["encoders"], HTTP),
    ("backends", ["backends", "storage", "encoders"], HTTP),
    ("indexing", ["indexing", "storage", "backends", "encoders"], HTTP),
    ("serving", ["serving", "storage", "backends", "contract"], HTTP),
    ("api", ["api", "serving", "storage", "backends", "encoders", "contract"], ()),
    ("sample_corpus", [], HTTP),
]


@pytest.fixture(scope="module")
def rollout_graph():
    return import_graph("vrag_rollout")


def test_the_rollout_package_keeps_its_layers(rollout_graph):
    assert violations(rollout_graph, "vrag_rollout", ROLLOUT_RULES) == []


def test_only_the_engine_layer_imports_vllm(rollout_graph):
    assert {m for m in library_users(rollout_graph, "vllm") if not in_layer(m, "vrag_rollout.engine")} == set()


def test_nothing_below_the_rollout_layer_imports_it(rollout_graph):
    below = ("core", "engine", "formats", "retrieval", "verify", "training")
    assert [f"{m} imports {t}" for m in rollout_graph for t in modules_imported(rollout_graph, m)
            if any(in_layer(m, f"vrag_rollout.{b}") for b in below) and in_layer(t, "vrag_rollout.rollout")] == []


def test_no_import_cycle_in_either_package(rollout_graph, server_graph):
    assert cycles(rollout_graph) == []
    assert cycles(server_graph) == []


@pytest.fixture(scope="module")
def server_graph():
    return import_graph("retriever_server")


def test_the_retriever_server_keeps_its_layers(server_graph):
    assert violations(server_graph, "retriever_server", SERVER_RULES) == []


def http_surface_importers(graph: dict[str, set[str]]) -> set[str]:
    """Modules outside `api/` and the command line that import the HTTP surface."""
    return {m for m in graph for t in modules_imported(graph, m) if in_layer(t, "retriever_server.api")
            and not in_layer(m, "retriever_server.api") and m != "retriever_server.cli"}


def test_only_the_command_line_imports_the_http_surface(server_graph):
    assert http_surface_importers(server_graph) == set()


def test_every_subpackage_maps_its_modules():
    """Each layer's __init__ docstring names every module in it, so the tree explains itself
    (retriever_server's own docstring maps its layers too)."""
    inits = [*(ROOT / "vrag_rollout").glob("*/__init__.py"), *(ROOT / "retriever_server").glob("*/__init__.py"),
             ROOT / "retriever_server" / "__init__.py"]
    for init in sorted(inits):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        for child in sorted(init.parent.iterdir()):
            name = child.stem if child.suffix == ".py" else child.name
            if name.startswith("_") or not (child.suffix == ".py" or (child / "__init__.py").exists()):
                continue
            assert f"`{name}`" in doc, f"{init.relative_to(ROOT)} does not describe `{name}`"


def planted(graph: dict[str, set[str]], module: str, name: str) -> dict[str, set[str]]:
    """A copy of `graph` in which `module` also imports `name`."""
    out = {m: set(names) for m, names in graph.items()}
    out[module].add(name)
    return out


def test_the_checks_catch_planted_violations(rollout_graph):
    """Each rule fails when it is broken: the same checks on the real graph plus one bad import."""
    def plant(module: str, name: str) -> dict[str, set[str]]:
        return planted(rollout_graph, module, name)

    assert violations(plant("vrag_rollout.core.step", "vrag_rollout.engine.llm.TurnOutput"), "vrag_rollout",
                      ROLLOUT_RULES) == ["vrag_rollout.core.step imports vrag_rollout.engine.llm"]
    assert violations(plant("vrag_rollout.core.vision", "urllib3"), "vrag_rollout", ROLLOUT_RULES) == [
        "vrag_rollout.core.vision imports urllib3"]
    assert violations(plant("vrag_rollout.verify.view", "vrag_rollout.core.positions"), "vrag_rollout",
                      ROLLOUT_RULES) == ["vrag_rollout.verify.view imports vrag_rollout.core.positions"]
    assert violations(plant("vrag_rollout.retrieval.fixtures", "vrag_rollout.core.actions.Search"),
                      "vrag_rollout", ROLLOUT_RULES) == [
        "vrag_rollout.retrieval.fixtures imports vrag_rollout.core.actions"]
    assert library_users(plant("vrag_rollout.rollout.agent", "vllm"), "vllm") - library_users(
        rollout_graph, "vllm") == {"vrag_rollout.rollout.agent"}
    assert cycles(plant("vrag_rollout.core.actions", "vrag_rollout.core.step")) != []
    assert violations(plant("vrag_rollout.formats.tags", "vrag_rollout.rollout.tools.Observer"), "vrag_rollout",
                      ROLLOUT_RULES) == ["vrag_rollout.formats.tags imports vrag_rollout.rollout.tools"]


# (importer, what it is made to import, the violation reported), one per retriever_server rule.
SERVER_PLANTS = [
    ("contract", "serving.wire.render", "serving.wire"),                  # the contract imports nothing
    ("storage.store", "backends.base.Backend", "backends.base"),          # storage: only itself
    ("encoders.base", "storage.store", "storage.store"),                  # encoders: only themselves
    ("backends.bm25", "indexing.roles", "indexing.roles"),                # backends: not the build
    ("indexing.indexer", "api.app.create_app", "api.app"),                # the build: no HTTP surface
    ("indexing.ingest", "serving.regions", "serving.regions"),            # the build: no serving
    ("serving.lifecycle", "indexing.indexer.build_index", "indexing.indexer"),  # serving: no build
    ("serving.service", "fastapi.HTTPException", None),                   # serving: no HTTP library
    ("api.app", "indexing.suggest", "indexing.suggest"),                  # the HTTP surface: no build
    ("sample_corpus", "storage.manifest", "storage.manifest"),            # the sample: nothing
]


@pytest.mark.parametrize("module, name, target", SERVER_PLANTS)
def test_the_server_checks_catch_planted_violations(server_graph, module, name, target):
    """Each retriever_server rule fails when it is broken, on the real graph plus one bad import."""
    module = f"retriever_server.{module}"
    name = name if target is None else f"retriever_server.{name}"
    reported = name if target is None else f"retriever_server.{target}"
    assert violations(planted(server_graph, module, name), "retriever_server", SERVER_RULES) == [
        f"{module} imports {reported}"]


def test_the_server_graph_checks_catch_planted_imports(server_graph):
    """Only cli imports the HTTP surface, and a cycle is found, on the real graph plus one import."""
    assert http_surface_importers(planted(server_graph, "retriever_server.serving.service",
                                          "retriever_server.api.metrics")) == {"retriever_server.serving.service"}
    assert cycles(planted(server_graph, "retriever_server.storage.manifest", "retriever_server.storage.store")) != []
