"""The live guard in verl 0.9.1's v1 trainer path (`integrations/verl/v1_rows.py`): the worker
`GuardedRowsManager` spawns guards each trajectory in `_agent_loop_postprocess`, before verl puts
its rows in TransferQueue.

As in tests/integrations/test_verl_segments.py (whose helpers this reuses): the loop runs on the
real tiny vLLM engine inside the real v1 worker class (the class its Ray actor runs, built without
Ray), called as verl's `_run_prompt` calls it, and its rows land in TransferQueue's key-value calls
held in memory (`QueueKV`: the real TransferQueue is a Ray service). Two rollouts, guard `drop`
(its settings from the loop's `vrag` entry): one row per trajectory (no context policy), and
segment rows (`context_keep_pages=1`, two rows an episode). A defect is planted into the loop's
output before the postprocessing (`devkit/planted_defects.py` on the output's lists), or into
verl's own position derivation (the processor's `get_rope_index` started one step late), and the
recorded trajectories are postprocessed again under each mode. Oracles: verl's unguarded v1 worker
storing the same outputs; transformers' `get_rope_index` of each stored row; verl's own v1 step
functions on the stored rows (`compute_advantage_for_multi_trajectories`, `compute_data_metrics`
through what `_compute_metrics` reads)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Optional

import numpy as np
import pytest
import ray
import torch

pytest.importorskip("hydra", reason="verl's agent loop needs hydra-core (the test extra)")
pytest.importorskip("transfer_queue", reason="verl's v1 trainer imports TransferQueue (the test extra)")

from verl.experimental.agent_loop.agent_loop import _agent_loop_registry  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.v1 import agent_loop_tq  # noqa: E402
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories  # noqa: E402

from tests.integrations.test_verl_segments import (  # noqa: E402
    FREE, REWARDS, QueueKV, Recording, RecordingV1Worker, prompt_kwargs, rope_positions, run_sessions, settings_for,
    v1_worker)
from tests.rollout.agent_helpers import sample_prompts  # noqa: E402
from vrag_rollout.devkit.planted_defects import plant  # noqa: E402
from vrag_rollout.integrations.verl.agent_loop import AGENT_NAME, SAMPLE_COLUMN  # noqa: E402
from vrag_rollout.integrations.verl.v1_rows import (  # noqa: E402
    GUARD_FIELD, MANAGER_CLASS, GuardedRowsManager, GuardedRowsWorker, install_v1_metrics)
from vrag_rollout.verify.guard import GuardFailure  # noqa: E402

ONE_ROW = {**FREE, "context_keep_pages": 0, "max_turns": 2}
CLEAN = {"checked": 1.0, "bad": 0.0, "dropped": 0.0}
FIRST_SAMPLE = 2  # episodes 2 and 3: rewards 0.5 and 0.0 (REWARDS), so GRPO has something to compare


class GuardedV1Worker(Recording, ray.remote(GuardedRowsWorker).__ray_metadata__.modified_class):
    """The worker `GuardedRowsManager` spawns, as its Ray actor runs it."""


class StoredRows(QueueKV):
    """The in-memory TransferQueue, read as the v1 trainer reads it (`tq.kv_batch_get`)."""

    def kv_batch_get(self, keys, partition_id=None, select_fields=None):
        for key in keys:
            missing = set(select_fields) - set(self.rows[key])
            if missing:
                raise ValueError(f"fields {sorted(missing)} not found for key {key}")
        return self.batch_get(keys, select_fields)


def guarded_worker(model_dir, llm, processor, policy: dict):
    settings = settings_for(processor, **policy, guard="drop", guard_positions_fraction=1.0)
    worker = v1_worker(model_dir, llm, settings, worker_class=GuardedV1Worker)
    worker.entry = _agent_loop_registry[AGENT_NAME]  # its own: the registry holds the last worker's
    return worker


def use_mode(worker, mode: str, samples_dir) -> None:
    """The worker's guard rebuilt from its loop entry with `guard: mode` (as a job sets it)."""
    entry = dict(worker.entry)
    entry["vrag"] = {**entry["vrag"], "guard": mode, "guard_samples_dir": str(samples_dir)}
    _agent_loop_registry[AGENT_NAME] = entry
    worker.set_guard_rank(0)
    worker.live_guard()


@pytest.fixture(scope="module")
def rolled(tiny_model_dir, tiny_processor, tiny_llm, tmp_path_factory):
    """One prompt, two sessions, guard `drop`, for each layout: one row (samples 0-1), segment rows
    (samples 2-3, two rows each); each into its own in-memory TransferQueue."""
    out = {}
    for name, policy, first in (("one_row", ONE_ROW, 0), ("segments", FREE, FIRST_SAMPLE)):
        worker = guarded_worker(tiny_model_dir, tiny_llm, tiny_processor, policy)
        samples_dir = tmp_path_factory.mktemp(f"{name}_bad_samples")
        use_mode(worker, "drop", samples_dir)
        kv = StoredRows()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(agent_loop_tq, "tq", kv)
            run_sessions(worker, prompt_kwargs(sample_prompts(1, with_images=False)), n=2, first_sample=first)
        handed = sorted(worker.handed, key=lambda item: item[1]["session_id"])  # as they finished: by session
        out[name] = SimpleNamespace(worker=worker, kv=kv, handed=handed, samples_dir=samples_dir)
    return out


def rows_of(output) -> list:
    return output if isinstance(output, list) else [output]


def keys_of(kwargs, output) -> list[str]:
    return [f"{kwargs['uid']}_{kwargs['session_id']}_{i}" for i in range(len(rows_of(output)))]


def postprocess(worker, handed, plants: Optional[dict] = None) -> StoredRows:
    """The recorded trajectories through `worker`'s `_agent_loop_postprocess` again (copies), each
    with the defects `plants` names for it ({trajectory: [(row, defect)]}) planted in its output."""
    kv = StoredRows()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(agent_loop_tq, "tq", kv)
        for t, (output, kwargs) in enumerate(handed):
            copies = [row.model_copy(deep=True) for row in rows_of(output)]
            for row, defect in (plants or {}).get(t, []):
                plant_output(defect, copies[row], worker.processor)
            asyncio.run(worker._agent_loop_postprocess(copies if isinstance(output, list) else copies[0], False,
                                                       **kwargs))
    return kv


def plant_output(defect: str, output, processor) -> None:
    """`planted_defects`' `defect` on one loop output, in place: its lists as a one-row batch."""
    p, r = len(output.prompt_ids), len(output.response_ids)
    lists = {"responses": output.response_ids, "response_mask": output.response_mask,
             "rollout_log_probs": output.response_logprobs,
             **{name: output.extra_fields.get(name) for name in ("turn_ids", "sampled_mask")}}
    tensors = {name: torch.tensor([values]) for name, values in lists.items() if values is not None}
    tensors.update(prompts=torch.tensor([output.prompt_ids]), attention_mask=torch.ones(1, p + r, dtype=torch.long))
    tensors["input_ids"] = torch.cat([tensors["prompts"], tensors["responses"]], dim=1)
    plant(defect, SimpleNamespace(batch=tensors, non_tensor_batch={}), processor, set())
    output.response_ids, output.response_mask = tensors["responses"][0].tolist(), tensors["response_mask"][0].tolist()
    if output.response_logprobs is not None:
        output.response_logprobs = tensors["rollout_log_probs"][0].tolist()
    planted = {name: tensors[name][0].tolist() for name in ("turn_ids", "sampled_mask") if name in tensors}
    output.extra_fields = {**output.extra_fields, **planted}


def late_rope_index(processor):
    """The processor's `get_rope_index` (which verl's `_compute_position_ids` calls) started one
    step late: `planted_defects`' `shifted_positions` on every sequence with an image."""
    rope_index = processor.get_rope_index

    def shifted(input_ids, *args, **kwargs):
        positions, deltas = rope_index(input_ids, *args, **kwargs)
        view = {"prompts": input_ids[:, :0], "responses": input_ids, "position_ids": positions.transpose(0, 1)}
        try:
            plant("shifted_positions", SimpleNamespace(batch=view, non_tensor_batch={}), processor, set())
        except ValueError:  # no image: nothing to shift
            pass
        return positions, deltas

    return shifted


def same(a, b) -> bool:
    a, b = getattr(a, "data", a), getattr(b, "data", b)
    if isinstance(a, dict) and "compute_score" in a and "generate_sequences" in a:  # a row's `metrics`:
        a, b = ({k: v for k, v in m.items() if k != "compute_score"} for m in (a, b))  # the scoring's clock aside
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def record_scoring(worker, monkeypatch) -> list:
    """verl's reward loop of `worker`, recording the response it scores (the list returned)."""
    scored, (scorer,) = [], worker.reward_loop_worker_handles

    async def recording(data):
        scored.append(data.batch["responses"][-1].tolist())
        return await scorer.compute_score.remote(data)

    monkeypatch.setattr(worker, "reward_loop_worker_handles",
                        [SimpleNamespace(compute_score=SimpleNamespace(remote=recording))])
    return scored


def stored_grids(row):
    inputs = getattr(row["multi_modal_inputs"], "data", row["multi_modal_inputs"])
    return inputs.get("image_grid_thw")


@pytest.mark.parametrize("layout", ["one_row", "segments"])
def test_a_clean_trajectory_lands_as_verl_stores_it_with_its_verdict(layout, rolled, tiny_model_dir, tiny_llm,
                                                                      tiny_processor):
    """Every stored row is, field by field, what verl's unguarded v1 worker stores of the same
    outputs, plus its `vrag_guard` verdict: clean, every row's positions compared with
    `get_rope_index` too; no bad sample saved."""
    run = rolled[layout]
    settings = settings_for(tiny_processor, **(FREE if layout == "segments" else ONE_ROW))
    plain = postprocess(v1_worker(tiny_model_dir, tiny_llm, settings, worker_class=RecordingV1Worker), run.handed)
    assert sorted(plain.rows) == sorted(run.kv.rows) and len(run.kv.rows) == (4 if layout == "segments" else 2)
    images = 0
    for key, row in run.kv.rows.items():
        assert set(row) == set(plain.rows[key]) | {GUARD_FIELD}
        assert same(row[GUARD_FIELD], CLEAN), (key, row[GUARD_FIELD])
        for name, value in plain.rows[key].items():
            assert same(row[name], value), (key, name)
        images += 0 if stored_grids(row) is None else len(stored_grids(row))
    assert images > 0
    assert all(len(rows_of(output)) == (2 if layout == "segments" else 1) for output, _ in run.handed)
    assert run.worker.live_guard().last.positions_checked == list(range(len(rows_of(run.handed[-1][0]))))
    assert not list(run.samples_dir.iterdir())


def test_verl_derives_each_row_once_the_guard_reading_what_it_stores(rolled, tmp_path, monkeypatch):
    """verl's derivation of a row's positions (its rope index) runs once per row: the guard's
    reading is the one verl's storing loop and its scoring get back (verl alone runs it once per row
    and once more for the last row's score)."""
    run = rolled["segments"]
    use_mode(run.worker, "drop", tmp_path)
    calls, rope_index = [], run.worker.processor.get_rope_index

    def counted(*args, **kwargs):
        calls.append(1)
        return rope_index(*args, **kwargs)

    monkeypatch.setattr(run.worker.processor, "get_rope_index", counted)
    kv = postprocess(run.worker, run.handed)
    assert len(calls) == len(kv.rows) == 4
    assert all(same(kv.rows[key], run.kv.rows[key]) for key in kv.rows)


def test_drop_empties_the_planted_episode_whole_and_verls_v1_step_takes_the_rows(rolled, tiny_model_dir,
                                                                                  tiny_processor, tmp_path,
                                                                                  monkeypatch):
    """A pad run cut short in the first row of one episode (what would stop the trainer's forward
    pass for every sample): both rows of that episode are emptied, the other episode is stored as
    before; the emptied rows are rows verl's v1 advantage step and metrics take, and the step's
    `guard/` counts come out of verl's own `compute_data_metrics`."""
    import verl.trainer.ppo.v1.trainer_base as trainer_base

    from vrag_rollout.verify.saved_batch import load_rollout

    run = rolled["segments"]
    use_mode(run.worker, "drop", tmp_path)
    scored = record_scoring(run.worker, monkeypatch)
    kv = postprocess(run.worker, run.handed, plants={0: [(0, "image_pads_cut")]})
    (bad_output, bad_kwargs), (good_output, good_kwargs) = run.handed
    # each episode scored once, on its last row as the loop gave it (the dropped one before it was emptied)
    assert scored == [bad_output[-1].response_ids, good_output[-1].response_ids]
    pad = tiny_processor.tokenizer.pad_token_id
    for i, key in enumerate(keys_of(bad_kwargs, bad_output)):
        row, verdict = kv.rows[key], kv.rows[key][GUARD_FIELD]
        assert verdict["bad"] == verdict["dropped"] == verdict["emptied"] == 1.0, verdict
        assert verdict.get("bad/image_tokens") == (1.0 if i == 0 else None), verdict  # row 1 goes with its episode
        assert row["responses"].tolist() == [pad] and row["response_mask"].tolist() == [0]
        assert row["rollout_log_probs"].tolist() == [0.0] and stored_grids(row) is None
        assert row["prompts"].tolist() == bad_output[i].prompt_ids  # the text prompt stays
        # positions: what transformers makes of the emptied row
        expected = rope_positions(tiny_model_dir, tiny_processor, row["input_ids"], None)
        assert torch.equal(row["position_ids"][1:], expected)
        extra = row["extra_fields"]
        assert extra["page_ids"] == [] and extra["tool_extra_fields"]["page_ids"] == [] and extra["turn_ids"] == [0]
        assert extra["multi_modal_data"] == {"images": []} and extra["context_length"] == 0
        # the episode's reward as the loop gave it: it stays in its GRPO group
        assert float(row["rm_scores"].sum()) == REWARDS[bad_kwargs[SAMPLE_COLUMN]]
    for key in keys_of(good_kwargs, good_output):
        assert same(kv.rows[key], run.kv.rows[key]), key
    # the episode's rows as the guard read them, saved where `vrag-rollout view` and `check` open them
    (path,) = tmp_path.iterdir()
    saved = load_rollout(path)
    assert len(saved) == 2 and all(saved.columns["guard_failures"])
    assert list(saved.columns["uid"]) == [bad_kwargs["uid"]] * 2

    keys = sorted(kv.rows)
    # verl's v1 `_compute_advantage`: GRPO over the sessions' last rows, broadcast to their rows
    data = kv.kv_batch_get(keys, "train", ["uid", "response_mask", "rm_scores", "rollout_log_probs"])
    data = DataProto(batch=data.to_padded_tensor())
    data.batch["token_level_scores"] = data.batch["token_level_rewards"] = data.batch["rm_scores"]
    data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
    out = compute_advantage_for_multi_trajectories(data, batch_keys=keys, adv_estimator="grpo")
    scores = torch.tensor([REWARDS[bad_kwargs[SAMPLE_COLUMN]], REWARDS[good_kwargs[SAMPLE_COLUMN]]])
    good_advantage = float(((scores - scores.mean()) / (scores.std() + 1e-6))[1])
    for row, key in enumerate(keys):
        advantages, mask = out.batch["advantages"][row], out.batch["response_mask"][row].bool()
        assert torch.isfinite(advantages).all()
        if key.startswith(f"{bad_kwargs['uid']}_{bad_kwargs['session_id']}_"):
            assert not mask.any() and not advantages.any()
        else:
            assert mask.any() and torch.allclose(advantages[mask], torch.tensor(good_advantage), atol=1e-5)

    # verl's v1 `_compute_metrics`: the step's rows read back, then verl's `compute_data_metrics`
    monkeypatch.setattr(trainer_base, "get_metric_data_with_optional_routed_experts",
                        trainer_base.get_metric_data_with_optional_routed_experts)
    monkeypatch.setattr(trainer_base, "compute_data_metrics", trainer_base.compute_data_metrics)
    install_v1_metrics()
    install_v1_metrics()  # a second call wraps nothing again
    assert not getattr(trainer_base.compute_data_metrics.__wrapped__, "vrag_guard", False)
    data = trainer_base.get_metric_data_with_optional_routed_experts(
        keys=keys, partition_id="train", fields=["prompts", "responses", "response_mask", "rm_scores", "num_turns"],
        moe_lb_metrics_interval=0, global_steps=1, accumulator=None, kv_batch_get=kv.kv_batch_get)
    data.pop("num_turns")
    lengths = [t.offsets().diff() if t.is_nested else torch.full((len(keys),), t.shape[1])  # all alike: stacked here
               for t in (data["prompts"], data["responses"])]
    prompt_length, response_length = lengths
    data = data.to_padded_tensor()
    data["token_level_scores"] = data["token_level_rewards"] = data["rm_scores"]
    data["advantages"] = data["returns"] = out.batch["advantages"]
    data["prompt_length"], data["response_length"] = prompt_length.float(), response_length.float()
    metrics_batch = DataProto(batch=data).select_idxs(np.array([True, True, True, False]))  # a padding row left out
    metrics = trainer_base.compute_data_metrics(batch=metrics_batch, use_critic=False)
    assert "critic/score/mean" in metrics
    guard = {name: value for name, value in metrics.items() if name.startswith("guard/")}
    counts = {name: guard.pop(f"guard/{name}") for name in ("checked", "bad", "dropped", "emptied")}
    assert counts == {"checked": 3.0, "bad": 2.0, "dropped": 2.0, "emptied": 2.0}, (counts, guard)
    # per check: the planted row's (a cut pad run fails more than one), its episode's other row's
    assert guard["guard/bad/image_tokens"] == guard["guard/bad/segments"] == 1.0, guard
    assert guard == {**{name: 1.0 for name in guard if name.startswith("guard/bad/")},
                     **{name.replace("/bad/", "/dropped/"): 1.0 for name in guard if name.startswith("guard/bad/")}}


@pytest.mark.parametrize("mode", ["drop", "warn"])
def test_the_guard_reads_the_positions_verl_derives_and_stores(mode, rolled, tiny_model_dir, tiny_processor,
                                                               tmp_path, monkeypatch):
    """verl's own position derivation broken (its rope index started one step late at a response
    image): the guard flags the positions verl stores. Under `warn` they are stored as verl derived
    them (transformers disagrees there); under `drop` the trajectory is emptied and verl's positions
    of the emptied row are transformers'."""
    run = rolled["one_row"]
    worker = run.worker
    use_mode(worker, mode, tmp_path)
    monkeypatch.setattr(worker.processor, "get_rope_index", late_rope_index(worker.processor))
    kv = postprocess(worker, run.handed)
    for output, kwargs in run.handed:
        (key,) = keys_of(kwargs, output)
        row = kv.rows[key]
        assert row[GUARD_FIELD]["bad"] == 1.0 and row[GUARD_FIELD].get("bad/positions") == 1.0, row[GUARD_FIELD]
        expected = rope_positions(tiny_model_dir, tiny_processor, row["input_ids"], stored_grids(row))
        if mode == "warn":
            assert row[GUARD_FIELD]["dropped"] == 0.0
            assert row["responses"].tolist() == output.response_ids
            assert not torch.equal(row["position_ids"][1:], expected)
        else:
            assert row[GUARD_FIELD]["emptied"] == 1.0 and row["response_mask"].tolist() == [0]
            assert torch.equal(row["position_ids"][1:], expected)


def test_drop_empties_a_row_verl_cannot_derive(rolled, tiny_model_dir, tiny_processor, tmp_path, monkeypatch):
    """A one-row trajectory whose pad run is cut short: verl's own derivation of its positions
    raises (without the guard the trajectory errors). The guard reports it and empties the row,
    which verl then derives, scores (the emptied row: there is no other to score) and stores."""
    run = rolled["one_row"]
    use_mode(run.worker, "drop", tmp_path)
    scored = record_scoring(run.worker, monkeypatch)
    kv = postprocess(run.worker, run.handed, plants={0: [(0, "image_pads_cut")]})
    (bad_output, bad_kwargs), (good_output, good_kwargs) = run.handed
    pad = tiny_processor.tokenizer.pad_token_id
    (key,) = keys_of(bad_kwargs, bad_output)
    row = kv.rows[key]
    assert row[GUARD_FIELD]["emptied"] == 1.0 and row[GUARD_FIELD].get("bad/derivation") == 1.0, row[GUARD_FIELD]
    assert row[GUARD_FIELD].get("bad/image_tokens") == 1.0
    assert row["responses"].tolist() == [pad] and row["response_mask"].tolist() == [0]
    assert torch.equal(row["position_ids"][1:], rope_positions(tiny_model_dir, tiny_processor, row["input_ids"], None))
    assert scored == [[pad], good_output.response_ids]
    (good_key,) = keys_of(good_kwargs, good_output)
    assert same(kv.rows[good_key], run.kv.rows[good_key])


def test_fail_raises_for_the_trajectory_and_stores_none_of_it(rolled, tmp_path):
    """The pad run cut in an episode's second row: `GuardFailure` out of the postprocessing (verl
    marks the prompt's sessions failed), no row of the episode stored, its rows saved."""
    run = rolled["segments"]
    use_mode(run.worker, "fail", tmp_path)
    with pytest.raises(GuardFailure, match=r"2 of 2 samples fail.*sample 1"):
        postprocess(run.worker, run.handed[:1], plants={0: [(1, "image_pads_cut")]})
    failures = run.worker.live_guard().last.failures
    assert "image_tokens" in {f.check for f in failures[1]} and "image_tokens" not in {f.check for f in failures[0]}
    assert len(list(tmp_path.iterdir())) == 1  # its rows saved all the same


@pytest.mark.parametrize("layout", ["one_row", "segments"])
def test_off_stores_what_the_loop_gave(layout, rolled, tiny_processor, tmp_path):
    """No guard built: an observation token put in the loss is stored as the loop gave it, with
    no verdict field; a pad run cut short fails in verl's own derivation, as without the guard."""
    run = rolled[layout]
    use_mode(run.worker, "off", tmp_path)
    assert run.worker.live_guard() is None
    kv = postprocess(run.worker, run.handed, plants={0: [(0, "observation_in_loss")]})
    output, kwargs = run.handed[0]
    assert all(GUARD_FIELD not in row for row in kv.rows.values()) and len(kv.rows) == len(run.kv.rows)
    planted = rows_of(output)[0].model_copy(deep=True)
    plant_output("observation_in_loss", planted, tiny_processor)
    assert kv.rows[keys_of(kwargs, output)[0]]["response_mask"].tolist() == planted.response_mask
    assert planted.response_mask != rows_of(output)[0].response_mask
    with pytest.raises(RuntimeError, match="shape mismatch"):
        postprocess(run.worker, run.handed[:1], plants={0: [(0, "image_pads_cut")]})
    assert not list(tmp_path.iterdir())


def test_the_manager_is_the_one_to_set_for_the_v1_trainer():
    from omegaconf import OmegaConf
    from verl.utils.import_utils import load_class_from_fqn

    from vrag_rollout.integrations.verl.guard import V1_MANAGER_CLASS, GuardedAgentLoopManager

    assert MANAGER_CLASS == V1_MANAGER_CLASS and load_class_from_fqn(MANAGER_CLASS) is GuardedRowsManager
    with pytest.raises(ValueError, match=f"(?s)agent_loop_manager_class={MANAGER_CLASS}.*trainer.use_v1=False"):
        GuardedAgentLoopManager(OmegaConf.create({"trainer": {"use_v1": True}}), llm_client=None)
