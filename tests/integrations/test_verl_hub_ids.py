"""A model named by its hub id, as users write verl configs (`actor_rollout_ref.model.path:
Qwen/Qwen2.5-VL-7B-Instruct`; verl keeps it as the path), read through the hub cache offline:
`vrag_agent` bans the same padded vocabulary rows as for the checkpoint's local directory, and
refuses to start, saying why, when it cannot read the checkpoint's width at all (an unbanned
padded row is a token no text decodes to, sampled into the training batch).

The hub is a cache directory in tmp_path laid out as `huggingface_hub` writes it
(`models--Qwen--Qwen2.5-VL-7B-Instruct/snapshots/<commit>/`, `refs/main`) holding the
released-shape tiny Qwen2.5-VL (its released vocabulary padding; no engine), with
`HF_HUB_OFFLINE=1`. verl's worker is built on the hub id as verl builds it (tokenizer,
processor and config from that path), and the loop as verl's worker instantiates it.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("hydra", reason="verl's agent loop needs hydra-core (the test extra)")

from tests.conftest import SAMPLE_RETRIEVAL  # noqa: E402
from vrag_rollout.devkit.demo import demo_config, demo_page_band  # noqa: E402
from vrag_rollout.devkit.tiny_model import RELEASED, build_tiny_model, default_model_dir  # noqa: E402
from vrag_rollout.families import UnreadableModelError, detect_family, logits_width  # noqa: E402
from vrag_rollout.integrations.verl import agent_loop  # noqa: E402
from vrag_rollout.integrations.verl.agent_loop import AGENT_NAME  # noqa: E402
from vrag_rollout.integrations.verl.local import local_worker  # noqa: E402

HUB_ID = "Qwen/Qwen2.5-VL-7B-Instruct"  # the model of examples/verl
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def released_dir():
    """The released-shape tiny Qwen2.5-VL (built once, cached across sessions)."""
    return build_tiny_model(default_model_dir("qwen2.5-vl", RELEASED), "qwen2.5-vl", shape=RELEASED)


@pytest.fixture
def offline_hub(tmp_path, monkeypatch, released_dir):
    """A hub cache holding `HUB_ID` (the tiny model's files), offline, for this test only.
    huggingface_hub reads its environment at import: its constants are set too."""
    from huggingface_hub import constants

    cache = tmp_path / "hf" / "hub"
    repo = cache / ("models--" + HUB_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for file in released_dir.iterdir():
        if not file.name.startswith("."):
            (snapshot / file.name).symlink_to(file)
    for name, value in (("HF_HOME", str(tmp_path / "hf")), ("HF_HUB_CACHE", str(cache)), ("HF_HUB_OFFLINE", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(agent_loop, "_drivers", {})  # no driver of another test's model
    return cache


def settings_for(processor) -> dict:
    config = demo_config(**demo_page_band(processor), n=1, retriever_fixtures=str(SAMPLE_RETRIEVAL),
                         action_regex=None, first_turn_action_regex=None)
    return {k: v for k, v in dataclasses.asdict(config).items() if v is not None}


def loop_on(model_path: str, settings: dict, loop_model_path: str | None = None):
    """verl's worker on `model_path` (its model.path), and the loop it instantiates
    (`AgentLoopWorker._run_agent_loop`), whose entry may name its own `model_path`."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry

    worker = local_worker(model_path, None, settings)
    entry = dict(_agent_loop_registry[AGENT_NAME])
    if loop_model_path is not None:
        entry["model_path"] = loop_model_path
    return hydra.utils.instantiate(
        config=entry, trainer_config=DictConfigWrap(worker.config), server_manager=worker.llm_client,
        tokenizer=worker.tokenizer, processor=worker.processor, hf_model_type=worker.hf_model_type,
        dataset_cls=worker.dataset_cls, data_config=DictConfigWrap(worker.config.data), tools=ToolListWrap([]))


def banned(loop) -> set:
    return {token for token, bias in loop.driver.sampling.params_kwargs(16, seed=0)["logit_bias"].items()
            if bias == -100.0}


def test_a_hub_id_bans_the_padded_rows_a_local_directory_bans(offline_hub, released_dir):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(released_dir)
    tokens, width = len(processor.tokenizer), logits_width(released_dir)
    padded = set(range(tokens, width))
    assert len(padded) == 152064 - 151665  # Qwen2.5-VL's released padding: 399 rows
    assert logits_width(HUB_ID) == width
    assert detect_family(HUB_ID).name == "qwen2.5-vl"  # from the cached config, no processor needed

    settings = settings_for(processor)
    local = banned(loop_on(str(released_dir), settings))
    hub = loop_on(HUB_ID, settings)
    assert hub.model_path == HUB_ID  # verl's model.path, as the user wrote it
    assert padded <= local and banned(hub) == local


def test_a_model_whose_width_cannot_be_read_is_refused_naming_the_fix(offline_hub, released_dir):
    from transformers import AutoProcessor

    assert logits_width("Qwen/Not-In-The-Cache") is None
    with pytest.raises(UnreadableModelError, match="Qwen/Not-In-The-Cache"):
        logits_width("Qwen/Not-In-The-Cache", required=True)
    settings = settings_for(AutoProcessor.from_pretrained(released_dir))
    with pytest.raises(Exception, match=r"(?s)vrag_agent: .*Qwen/Not-In-The-Cache.*HF_HUB_OFFLINE.*padded.*"
                                        r"model_path"):  # hydra wraps it, as verl's worker instantiates the loop
        loop_on(HUB_ID, settings, loop_model_path="Qwen/Not-In-The-Cache")
