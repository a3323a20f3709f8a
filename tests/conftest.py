"""Session-wide fixtures: the tiny models of every family in both shapes (docs/tiny-models.md:
`compact` for every test, `released` for the tests whose subject is a released-checkpoint trait),
one vLLM engine per family and shape (built on first use and shared by every test of the
session, or of the pytest-xdist worker), the recorded retrieval.

The tiers (README "Tests"): every test that uses an engine fixture (`ENGINE_FIXTURES`, directly
or through another fixture) or reads background work (tests/background.py: subprocesses that run
models) is marked `engine` at collection; a test that starts an engine another way (a subprocess
running a model, Ray workers) carries the mark itself. Tests that start processes or servers are
marked `process`, long stress runs `stress`. `make test-fast` runs the rest, the pure tier, and a
test there that starts an in-process engine (`_no_engine_outside_the_mark`), a process or a
server (`_pure_tier_refusals`) fails, naming the mark to give it.

Under pytest-xdist (`make test`), tests/xdist_schedule.py hands out whole modules, and the tests
of the released-shape engines as one unit.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import vrag_rollout.engine.llm as engine_llm
from vrag_rollout.engine.llm import SAMPLED_LOGPROBS_MODE, configure_cpu_defaults
from vrag_rollout.families import FAMILY_NAMES
from vrag_rollout.devkit.tiny_model import COMPACT, RELEASED, build_tiny_model, build_tiny_qwen2vl, default_model_dir

FIXTURES = Path(__file__).parent / "fixtures"
SAMPLE_RETRIEVAL = FIXTURES / "sample_retrieval.json"

# One OpenMP thread per process (this one and its subprocesses: background work, doc commands,
# Ray workers) unless the caller set OMP_NUM_THREADS: the tiny models' ops are too small to gain
# from a second thread, and beside other work on the same cores a 2-thread rollout ran ~3x slower
# (tests/integrations/test_verl_agent_loop.py: 348 s -> 265 s). Before torch is imported, and set
# on torch too in case it was: once an engine starts, vLLM makes torch.set_num_threads a no-op.
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
configure_cpu_defaults()  # before anything imports vLLM


# The test engines' settings (the `engines` fixture's, and a background process's own engine).
ENGINE_ARGS = dict(
    dtype="float32",
    # 4096: a 12-turn native tool-call episode is ~3200 tokens (tests/rollout/test_context_segments.py);
    # no slower to start nor larger than 2048 (the profile run is max_num_batched_tokens long, the
    # KV cache a fixed size), and the same tokens and log-probs
    max_model_len=4096,
    max_num_batched_tokens=4096,  # at least max_model_len (chunked prefill is off)
    enforce_eager=True,
    limit_mm_per_prompt={"image": 8, "video": 0},
    seed=0,
    logprobs_mode=SAMPLED_LOGPROBS_MODE,  # as build_llm builds the rollout's engine
    skip_mm_profiling=True,
    # A quarter GiB of KV cache (the CPU default is 1 GiB): ~250k tokens of the tiny models, where
    # the largest test batch holds ~50k; several engines live in each test process.
    kv_cache_memory_bytes=256 * 2**20,
)
RELEASED_FIXTURES = frozenset({"released_model", "released_qwen2vl"})
ENGINE_FIXTURES = frozenset({"engines", "tiny_llm", "family_models", "family_model"}) | RELEASED_FIXTURES


def pytest_collection_modifyitems(config, items):
    for item in items:
        # Background work (tests/background.py) is subprocesses that run models.
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())) or _background_work(item) is not None:
            item.add_marker(pytest.mark.engine)
    # Tests that read background work run last, in their order: the work has the most time.
    items.sort(key=lambda item: _background_work(item) is not None)
    if hasattr(config, "workerinput"):
        # Under pytest-xdist the tests of the released-shape engines are one unit of work: one
        # worker starts those engines, not each (tests/xdist_schedule.py).
        from tests.xdist_schedule import publish_named_units

        released = {item.nodeid: "released-shape" for item in items if _uses_released_shape(item)}
        publish_named_units(config, released)


def _uses_released_shape(item) -> bool:
    """The test uses a released-shape engine: through a fixture, or marked (a parameter's mark)."""
    return bool(RELEASED_FIXTURES & set(getattr(item, "fixturenames", ()))
                or item.get_closest_marker("released_shape"))


def _background_work(item) -> Any:
    """The background work `item` reads: its mark's, else that of a fixture it uses
    (`tests.background.uses`)."""
    marker = item.get_closest_marker("background")
    if marker:
        return marker.args[0]
    fixtures = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        for fixture in (fixtures.name2fixturedefs.get(name, ()) if fixtures else ())[-1:]:
            if (work := getattr(fixture.func, "background_work", None)) is not None:
                return work
    return None


def _build_the_sample_index_first() -> None:
    """The demo's sample index in the shared cache, built now unless it is there: before processes
    that may all build it at once (the tiny models' builds are atomic; this one is not)."""
    from vrag_rollout.devkit.demo import cache_dir, prepare_index

    if not (cache_dir() / "sample-index" / "manifest.json").exists():
        prepare_index(cache_dir())


def pytest_configure(config):
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        _build_the_sample_index_first()  # pytest-xdist's controller, before its workers start


def pytest_collection_finish(session):
    """Start the `background` work of the selected tests (tests/background.py): all of it here, or
    this pytest-xdist worker's share (every worker collects the same tests)."""
    if session.config.option.collectonly:
        return
    works = list(dict.fromkeys(work for item in session.items if (work := _background_work(item))))
    if not works:
        return
    from tests import background as jobs

    _build_the_sample_index_first()  # the work's commands read it, as in-process tests do
    jobs.start(works, session.config._tmp_path_factory)


def pytest_sessionfinish(session, exitstatus):
    """Stop the background work if the session stops early; otherwise let it end (a test in
    another xdist worker may still read it)."""
    from tests import background as jobs

    if not (session.shouldstop or session.shouldfail or exitstatus == pytest.ExitCode.INTERRUPTED):
        jobs.wait_all()
    jobs.cancel_all()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist, whole modules to a worker (their module fixtures are rollouts: split, each
    worker would redo them), in collection order (background readers last); a module whose tests
    collection split in two runs is two units (tests/xdist_schedule.py)."""
    from tests.xdist_schedule import ModuleRunScheduling

    return ModuleRunScheduling(config, log)


@pytest.fixture
def background(request, tmp_path_factory):
    """The return value of this test's `background` work (tests/background.py)."""
    from tests import background as jobs

    work = _background_work(request.node)
    assert work is not None, "mark the test @pytest.mark.background.with_args(work)"
    return jobs.result(work, tmp_path_factory)


# What a test of the pure tier may not do (each refused while an unmarked test sets up and runs,
# module- and session-scoped fixtures it is the first to use included).
_PROCESS_STARTS = (("subprocess", "Popen", "_execute_child"), ("os", None, "fork"), ("os", None, "posix_spawn"),
                   ("socket", "socket", "bind"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _pure_tier_refusals(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _pure_tier_refusals(item):
        return (yield)


@contextmanager
def _pure_tier_refusals(item):
    """In a test with none of the tier marks (`make test-fast`'s), starting a process or binding
    a socket (a server) fails the test with the mark to give it: the fast tier stays fast."""
    if any(item.get_closest_marker(mark) for mark in ("engine", "process", "stress")):
        yield
        return
    import importlib

    saved = []
    for module_name, class_name, attr in _PROCESS_STARTS:
        owner = importlib.import_module(module_name)
        owner = getattr(owner, class_name) if class_name else owner
        if hasattr(owner, attr):
            original = getattr(owner, attr)
            saved.append((owner, attr, original))
            setattr(owner, attr, _refusal(f"{module_name}.{class_name + '.' if class_name else ''}{attr}", original))
    try:
        yield
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)


def _refusal(what: str, original: Any):
    def refuse(*args: Any, **kwargs: Any) -> Any:
        # Background work (tests/background.py) runs its commands in threads of its own, beside
        # every test; a library's import-time probe (vLLM's cpuinfo runs `file`) is not the test's.
        if threading.current_thread().name.startswith("background-") or _inside_an_import():
            return original(*args, **kwargs)
        pytest.fail(f"this test calls {what} (a process or a server): mark it @pytest.mark.process "
                    "(tests/conftest.py), or keep it in-process")

    return refuse


def _inside_an_import() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


@pytest.fixture(autouse=True)
def _no_engine_outside_the_mark(request, monkeypatch):
    """An unmarked test (one `make test-fast` runs) must not start a vLLM engine in-process."""
    if request.node.get_closest_marker("engine") is None:
        import vrag_rollout.engine.llm as llm

        def refuse(**_: Any) -> Any:
            pytest.fail("this test starts a vLLM engine: use the engine fixtures (tests/conftest.py) "
                        "or mark it @pytest.mark.engine")

        monkeypatch.setattr(llm, "create_llm", refuse)


@pytest.fixture(scope="session")
def tiny_model_dir():
    """The cached compact tiny Qwen2-VL (built once, reused across sessions)."""
    return build_tiny_qwen2vl(default_model_dir())


@pytest.fixture(scope="session")
def tiny_processor(tiny_model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def engines():
    """model dir -> its one in-process vLLM engine on CPU, started on first use, kept all session."""
    started: dict[str, Any] = {}

    def engine_for(model_dir) -> Any:
        key = str(model_dir)
        if key not in started:
            # Through the module, so that `_no_engine_outside_the_mark` sees this start too.
            started[key] = engine_llm.create_llm(model=key, **ENGINE_ARGS)
        return started[key]

    yield engine_for
    started.clear()


@pytest.fixture(scope="session")
def tiny_llm(tiny_model_dir, engines):
    """The tiny Qwen2-VL's engine (the same one `family_models("qwen2-vl")` hands out)."""
    return engines(tiny_model_dir)


@dataclass(frozen=True)
class FamilyModel:
    family: str
    model_dir: Path
    processor: Any
    llm: Any


@pytest.fixture(scope="session")
def family_models(engines):
    """(family name, shape) -> FamilyModel (tiny model, its processor, its engine), each built
    once; the shape defaults to compact."""
    from transformers import AutoProcessor

    built: dict[tuple[str, str], FamilyModel] = {}

    def get(family: str, shape: str = COMPACT) -> FamilyModel:
        if (family, shape) not in built:
            model_dir = build_tiny_model(default_model_dir(family, shape), family, shape=shape)
            processor = AutoProcessor.from_pretrained(model_dir)
            built[family, shape] = FamilyModel(family, model_dir, processor, engines(model_dir))
        return built[family, shape]

    return get


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def family_model(request, family_models) -> FamilyModel:
    """Parametrizes a test module over every supported family (compact shape)."""
    return family_models(request.param)


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def released_model(request, family_models) -> FamilyModel:
    """Parametrizes a test module over every family's released-shape model: the released ids and
    logits width, for tests whose subject is a released-checkpoint trait."""
    return family_models(request.param, RELEASED)


@pytest.fixture(scope="session")
def released_qwen2vl(family_models) -> FamilyModel:
    """The released-shape Qwen2-VL and its engine."""
    return family_models("qwen2-vl", RELEASED)
