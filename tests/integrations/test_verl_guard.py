"""The live guard in verl's worker path (`integrations/verl/guard.py`): verl 0.9.1's
`AgentLoopWorker` (built without Ray by `local.py`, as the guard's `GuardedAgentLoopWorker`) rolls
out `vrag_agent` once on the tiny model's CPU engine (demo grammar, replayed retrieval, n=2);
verl's `_postprocess` builds the batch and the guard inspects it. The six defects of
tests/verify/test_guard.py are planted by `scripts/check_verl.py`'s `PlantingWorker` into verl's
batch between its postprocessing and the guard, each into a fresh batch of the same trajectories
(verl's postprocessing replayed; no second engine run):
- the clean batch has no bad sample and nothing dropped;
- each defect: exactly the planted sample is bad, `drop` zeroes its mask and no other row's, and
  its rows are saved where `vrag-rollout check` reads them and fails them;
- `fail`: the worker raises `GuardFailure` naming the planted sample (the step stops);
- the counts and the per-turn drift reach the trainer's metrics through verl's own
  `ray_trainer.compute_data_metrics` and `debug.metrics.calculate_debug_metrics`, the drift from
  the actor's log-probs of the batch. verl's actor needs a GPU build here, so those log-probs
  come from the same HF forward `training/grpo.response_log_probs` computes (the family's
  model, the batch's images through its processor).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("hydra", reason="verl's agent loop needs hydra-core (the test extra)")

from tests.conftest import SAMPLE_RETRIEVAL  # noqa: E402
from tests.integrations.test_verl_agent_loop import REPO  # noqa: E402
from tests.rollout.agent_helpers import sample_prompts  # noqa: E402
from vrag_rollout.devkit.demo import demo_config, demo_page_band  # noqa: E402
from vrag_rollout.integrations.verl.local import local_worker, prompt_rows  # noqa: E402
from vrag_rollout.verify.drift import batch_drift  # noqa: E402
from vrag_rollout.verify.guard import GUARD_COLUMN, GuardFailure, column_metrics  # noqa: E402

N = 2


def load_check_script():
    spec = importlib.util.spec_from_file_location("check_verl", REPO / "scripts" / "check_verl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPT = load_check_script()


def settings(processor, samples_dir, mode: str) -> dict:
    config = demo_config(**demo_page_band(processor), action_format="tags", n=1, retriever_fixtures=str(SAMPLE_RETRIEVAL),
                         guard=mode, guard_positions_fraction=1.0, guard_samples_dir=str(samples_dir))
    return {k: v for k, v in dataclasses.asdict(config).items() if v is not None}


@pytest.fixture(scope="module")
def rolled(tiny_model_dir, tiny_processor, tiny_llm, tmp_path_factory):
    """One rollout through the guarded worker (drop); its clean batch and the worker."""
    samples_dir = tmp_path_factory.mktemp("guard_bad_samples")
    worker = local_worker(tiny_model_dir, tiny_llm, settings(tiny_processor, samples_dir, "drop"),
                          SCRIPT.planting_worker_class())
    batch = asyncio.run(worker.generate_sequences(prompt_rows(sample_prompts(4, with_images=False), "tags", n=N)))
    return SimpleNamespace(worker=worker, batch=batch, samples_dir=samples_dir)


def test_the_clean_batch_has_no_bad_sample(rolled):
    batch = rolled.batch
    assert column_metrics(batch.non_tensor_batch[GUARD_COLUMN]) == {
        "guard/bad": 0.0, "guard/checked": float(len(batch)), "guard/dropped": 0.0}
    assert rolled.worker.live_guard().last.positions_checked == list(range(len(batch)))  # mrope on every sample
    assert all(batch.batch["response_mask"][row].any() for row in range(len(batch)))
    # the loop's turn ids became verl's (B, R) tensor: 0 exactly on padding, turn 1 first
    turn_ids, P = batch.batch["turn_ids"], batch.batch["prompts"].shape[1]
    assert torch.equal(turn_ids > 0, batch.batch["attention_mask"][:, P:].bool())
    assert (turn_ids[:, 0] == 1).all() and "turn_ids" not in batch.non_tensor_batch
    assert not list(rolled.samples_dir.iterdir())


def test_each_distinct_page_is_processed_once_and_its_outputs_shared(rolled, tiny_model_dir):
    """Pages once in verl's worker (`integrations/verl/pages.py`): the image processor ran once
    per distinct page; each trajectory's `multi_modal_inputs` equal, bit for bit, a fresh
    processor's outputs for its own images (the oracle: verl as shipped computes exactly those);
    trajectories showing a page share its outputs, and the pickled column carries them once."""
    import pickle

    from transformers import AutoProcessor

    from vrag_rollout.core.pages import PageEntry, pixels
    from vrag_rollout.integrations.image_inputs import OncePerImage, SharedImageInputs

    batch = rolled.batch
    shown = [list(item["images"]) for item in batch.non_tensor_batch["multi_modal_data"]]
    assert all(isinstance(entry, PageEntry) for row in shown for entry in row)
    distinct = {entry.key for row in shown for entry in row}
    assert sum(len(row) for row in shown) > len(distinct) >= 1
    once = rolled.worker.processor.image_processor
    assert isinstance(once, OncePerImage) and once.processed == len(distinct)

    oracle = AutoProcessor.from_pretrained(tiny_model_dir).image_processor
    column = batch.non_tensor_batch["multi_modal_inputs"]
    owners: dict = {}
    for inputs, images in zip(column, shown):
        if not images:
            assert "pixel_values" not in inputs
            continue
        assert isinstance(inputs, SharedImageInputs)
        want = oracle(images=[pixels(entry) for entry in images], return_tensors="pt")
        for name in want.keys():
            assert torch.equal(inputs[name], want[name]), name
        grid = want["image_grid_thw"]
        assert torch.equal(inputs["images_seqlens"], torch.repeat_interleave(grid[:, 1] * grid[:, 2], grid[:, 0]))
        for entry, part in zip(images, inputs.parts):
            assert owners.setdefault(entry.key, part) is part  # one outputs object per page
    per_page = sum(part["pixel_values"].nbytes for part in owners.values())
    assert len(pickle.dumps(column)) < 1.1 * per_page


@pytest.mark.parametrize("plant", list(SCRIPT.PLANTS))
def test_each_planted_defect_is_caught_and_dropped_alone(plant, rolled, tiny_model_dir):
    from vrag_rollout.verify.check import run_check
    from vrag_rollout.verify.saved_batch import load_rollout

    worker = rolled.worker
    saved_before = list(worker.live_guard().samples.paths)
    out = worker.replay(plant)
    planted, before = worker.planted, worker.before_guard
    verdicts = out.non_tensor_batch[GUARD_COLUMN]
    assert [row for row, verdict in enumerate(verdicts) if verdict["bad"]] == [planted], worker.live_guard().last.lines()
    assert before[planted].any() and not out.batch["response_mask"][planted].any()
    others = [row for row in range(len(out)) if row != planted]
    assert torch.equal(out.batch["response_mask"][others], before[others])
    counts = column_metrics(verdicts)
    assert counts["guard/bad"] == counts["guard/dropped"] == 1.0 and counts["guard/checked"] == len(out)
    # the planted row as it came out of verl, saved where `check` (and `view`) read it, with its failures
    (path,) = [p for p in worker.live_guard().samples.paths if p not in saved_before]
    saved = load_rollout(path)
    assert len(saved) == 1 and saved.columns["guard_failures"][0]
    report = run_check(path, tiny_model_dir)
    if plant == "duplicated_group":  # one sample of the group saved: no group left to compare
        assert report.ok
    else:
        assert {f.sample for f in report.failures} == {0}, report.human()


@pytest.mark.parametrize("plant", ["image_pads_cut", "vision_token_sampled"])
def test_drop_leaves_every_row_as_verls_own_code_derives_it(plant, rolled, tiny_processor):
    """An emptied sample's derived columns, re-derived: each row's `multi_modal_inputs` and
    `position_ids` equal what verl's own `_compute_multi_modal_inputs` and `_compute_position_ids`
    make of the row's tokens and images now, and its image pads are exactly as many as its image
    features (the forward's own condition; verl raises for the whole step otherwise). The reward
    reads no page of it."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from vrag_rollout.core.pages import pixels

    worker = rolled.worker
    out = worker.replay(plant)
    row = worker.planted
    assert out.non_tensor_batch[GUARD_COLUMN][row].get("emptied") == 1.0
    t, columns = out.batch, out.non_tensor_batch
    image_pad = tiny_processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    merge = tiny_processor.image_processor.merge_size
    for r in range(len(out)):
        ids, attention = t["input_ids"][r:r + 1], t["attention_mask"][r:r + 1]
        images = [pixels(entry) for entry in columns["multi_modal_data"][r]["images"]]  # as the loop hands verl:
        output = SimpleNamespace(multi_modal_data={"images": images} if images else None, mm_processor_kwargs=None)
        fresh = dict(AgentLoopWorker._compute_multi_modal_inputs(worker, output, ids))
        positions = AgentLoopWorker._compute_position_ids(worker, ids, attention, fresh,
                                                          worker._get_mm_processor_kwargs(None))
        assert torch.equal(t["position_ids"][r], positions[0]), r
        held = columns["multi_modal_inputs"][r]
        assert sorted(held.keys()) == sorted(fresh.keys()), r
        for name in fresh:
            assert torch.equal(held[name], fresh[name]), (r, name)
        pads = int(((ids[0] == image_pad) & attention[0].bool()).sum())
        features = int(held["images_seqlens"].sum()) // merge ** 2 if "images_seqlens" in held else 0
        assert pads == features, (r, pads, features)
    assert columns["tool_extra_fields"][row]["page_ids"] == [] and list(columns["page_ids"][row]) == []
    assert any(columns["tool_extra_fields"][r]["page_ids"] for r in range(len(out)) if r != row)


def test_fail_stops_the_step_at_the_planted_sample(rolled, tiny_model_dir, tiny_processor, tiny_llm, tmp_path):
    failing = local_worker(tiny_model_dir, tiny_llm, settings(tiny_processor, tmp_path, "fail"),
                           SCRIPT.planting_worker_class())
    failing.recorded = rolled.worker.recorded  # the same trajectories, through a worker set to fail
    for plant in SCRIPT.PLANTS:
        with pytest.raises(GuardFailure, match=r"guard: 1 of \d+ samples fail the batch checks") as stopped:
            failing.replay(plant)
        assert f"sample {failing.planted}" in str(stopped.value), plant
    clean = failing.replay(None)  # the control: the clean batch passes a failing guard
    assert column_metrics(clean.non_tensor_batch[GUARD_COLUMN])["guard/bad"] == 0


def test_counts_and_drift_reach_the_trainers_metrics(rolled, tiny_model_dir, tiny_processor):
    """As verl's RayPPOTrainer.fit does after the manager's concat and its balance_batch reorder:
    `calculate_debug_metrics` right after the actor's log-probs, `compute_data_metrics` at the end."""
    import verl.trainer.ppo.ray_trainer as ray_trainer
    import verl.utils.debug.metrics as debug_metrics
    from transformers import AutoModelForImageTextToText
    from verl.protocol import DataProto

    from vrag_rollout.integrations.verl.guard import install_trainer_metrics
    from vrag_rollout.training.grpo import response_log_probs

    install_trainer_metrics()
    install_trainer_metrics()  # idempotent: one wrapper each
    assert not hasattr(ray_trainer.compute_data_metrics.__wrapped__, "__wrapped__")
    dropped = rolled.worker.replay("observation_in_loss")
    planted = rolled.worker.planted
    half = len(dropped) // 2
    batch = DataProto.concat([dropped[:half], dropped[half:]])  # two workers' chunks
    order = torch.arange(len(batch)).flip(0)
    batch.reorder(order)  # balance_batch
    # the actor's log-probs of the batch: the HF forward training/grpo uses (verl's actor needs a GPU here)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    view = SimpleNamespace(batch={**dict(batch.batch.items()), "loss_mask": batch.batch["response_mask"]},
                           non_tensor_batch=batch.non_tensor_batch, meta_info={})
    with torch.no_grad():
        batch.batch["old_log_probs"] = response_log_probs(model, tiny_processor, view, 1.0)

    # sampled under the demo grammar, as each row's rollout_meta records: no drift (constrained logprobs)
    assert not any(key.startswith("guard/drift") for key in debug_metrics.calculate_debug_metrics(batch))
    # as if sampled freely (the record cleared), for the drift's wiring and arithmetic
    batch.non_tensor_batch["rollout_meta"] = np.array([{**meta, "action_grammar": False}
                                                       for meta in batch.non_tensor_batch["rollout_meta"]], dtype=object)
    debug = debug_metrics.calculate_debug_metrics(batch)  # as fit calls it after the old log-probs
    assert "training/rollout_probs_diff_max" in debug  # verl's own metrics are kept
    drift = batch_drift(batch, batch.batch["old_log_probs"], "response_mask")
    assert {k: v for k, v in debug.items() if k.startswith("guard/drift/")} == drift.metrics()
    turns = sorted({int(t) for t in batch.batch["turn_ids"][batch.batch["response_mask"].bool()].tolist()})
    assert drift.turns == turns and len(turns) > 1 and all(np.isfinite(list(drift.mean.values())))
    compared = int((batch.batch["response_mask"].bool() & (batch.batch["turn_ids"] > 0)).sum())
    assert sum(drift.tokens.values()) == compared  # the dropped sample's tokens are not compared
    assert int(order.tolist().index(planted)) not in {s for s, _, _ in drift.worst}

    R = batch.batch["responses"].shape[1]
    for key in ("token_level_scores", "token_level_rewards", "advantages", "returns"):  # the step's own fields
        batch.batch[key] = torch.zeros(len(batch), R)
    data = ray_trainer.compute_data_metrics(batch=batch, use_critic=False)
    assert "response_length/mean" in data  # verl's own
    assert {k: v for k, v in data.items() if k.startswith("guard/")} == {
        "guard/bad": 1.0, "guard/bad/observations": 1.0, "guard/bad/turns": 1.0, "guard/checked": float(len(batch)),
        "guard/dropped": 1.0, "guard/dropped/observations": 1.0, "guard/dropped/turns": 1.0}


def test_the_manager_refuses_verls_v1_trainer():
    from omegaconf import OmegaConf

    from vrag_rollout.integrations.verl.guard import GuardedAgentLoopManager

    with pytest.raises(ValueError, match="trainer.use_v1=False"):
        GuardedAgentLoopManager(OmegaConf.create({"trainer": {"use_v1": True}}), llm_client=None)


@pytest.mark.parametrize("script", sorted((REPO / "examples" / "verl").glob("grpo_*.sh")), ids=lambda p: p.stem)
@pytest.mark.process
def test_the_example_jobs_run_the_guard(script, tmp_path):
    """The jobs select the guarded manager and verl's synchronous trainer; their loop sets `guard: drop`."""
    from omegaconf import OmegaConf

    from tests.integrations.test_verl_examples import overrides
    from vrag_rollout.integrations.verl.guard import MANAGER_CLASS

    found = overrides(script, tmp_path)
    assert f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER_CLASS}" in found
    assert "trainer.use_v1=False" in found
    path = next(o.split("=", 1)[1] for o in found if "agent_loop_config_path=" in o)
    (entry,) = [e for e in OmegaConf.to_container(OmegaConf.load(REPO / path)) if e["name"] == "vrag_agent"]
    assert entry["vrag"]["guard"] == "drop"
