"""Session-wide fixtures: the tiny models of every family, one vLLM engine per family (built on
first use and shared by every test of the session), the recorded retrieval.

Every test that uses an engine fixture (`ENGINE_FIXTURES`, directly or through another fixture)
or reads background work (tests/background.py: subprocesses that run models) is marked `engine` at
collection; `make test-fast` (`pytest -m "not engine" -n auto`) runs the rest. A test that starts
an engine another way (a subprocess running a model, Ray workers) carries the mark itself, and one
that would start an in-process engine unmarked fails (`_no_engine_outside_the_mark`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from vrag_rollout.engine.llm import SAMPLED_LOGPROBS_MODE, configure_cpu_defaults, create_llm
from vrag_rollout.families import FAMILY_NAMES
from vrag_rollout.devkit.tiny_model import build_tiny_model, build_tiny_qwen2vl, default_model_dir

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
    max_model_len=2048,
    max_num_batched_tokens=4096,
    enforce_eager=True,
    limit_mm_per_prompt={"image": 8, "video": 0},
    seed=0,
    logprobs_mode=SAMPLED_LOGPROBS_MODE,  # as build_llm builds the rollout's engine
)
ENGINE_FIXTURES = frozenset({"engines", "tiny_llm", "family_models", "family_model"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        # Background work (tests/background.py) is subprocesses that run models.
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())) or _background_work(item) is not None:
            item.add_marker(pytest.mark.engine)
    # Tests that read background work run last, in their order: the work has the most time.
    items.sort(key=lambda item: _background_work(item) is not None)


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
    """Start the `background` work of the selected tests (tests/background.py). Not in a
    pytest-xdist worker, which runs only some of them: there, `background.result` runs the work
    when a test first needs it."""
    if session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return
    works = list(dict.fromkeys(work for item in session.items if (work := _background_work(item))))
    if not works:
        return
    from tests import background as jobs

    _build_the_sample_index_first()  # the work's commands read it, as in-process tests do
    jobs.start(works, session.config._tmp_path_factory)


def pytest_sessionfinish(session):
    from tests import background as jobs

    jobs.cancel_all()


@pytest.fixture
def background(request, tmp_path_factory):
    """The return value of this test's `background` work (tests/background.py)."""
    from tests import background as jobs

    work = _background_work(request.node)
    assert work is not None, "mark the test @pytest.mark.background.with_args(work)"
    return jobs.result(work, tmp_path_factory)


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
    """The cached tiny model (built once, reused across sessions)."""
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
            started[key] = create_llm(model=key, **ENGINE_ARGS)
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
    """family name -> FamilyModel (tiny model, its processor, its engine), each built once."""
    from transformers import AutoProcessor

    built: dict[str, FamilyModel] = {}

    def get(family: str) -> FamilyModel:
        if family not in built:
            model_dir = build_tiny_model(default_model_dir(family), family)
            built[family] = FamilyModel(family, model_dir, AutoProcessor.from_pretrained(model_dir), engines(model_dir))
        return built[family]

    return get


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def family_model(request, family_models) -> FamilyModel:
    """Parametrizes a test module over every supported family."""
    return family_models(request.param)
