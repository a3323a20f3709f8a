"""Context edits through verl: `vrag_agent` hands verl 0.9.1's v1 worker an episode's segment rows,
one `AgentLoopOutput` each (`integrations/verl/segments.py`).

The loop runs on the real tiny vLLM engine inside verl's own v1 worker class (`AgentLoopWorkerTQ`,
the class its Ray actor runs; built without Ray as `local.local_worker` builds a worker), called as
its `_run_prompt` calls it: one `_run_agent_loop` per session, verl's own `_agent_loop_postprocess`
for a list (reward on the last row through verl's reward manager, copied to the earlier rows; each
row's processor inputs and positions computed by verl's `_compute_multi_modal_inputs` and
`_compute_position_ids`), whose rows land in TransferQueue's key-value interface (held in memory
here: the real TransferQueue is a Ray service). Two rollouts: turns after the first sample freely
under `context_keep_pages=1` (2 rows an episode; their log-probs must match a forward pass over the
rows as stored), and a search every turn under `context_keep_turns=1` (3 rows an episode).
Oracles: transformers' `get_rope_index` and the processor's grids for each stored row; the
project's `check` (forward pass included) on the rows padded by verl's own one-output postprocessing;
verl's `compute_advantage_for_multi_trajectories` against GRPO computed by episode; the refusals;
and, without a context policy, the one output as before."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from types import SimpleNamespace

import numpy as np
import pytest
import ray
import torch

pytest.importorskip("hydra", reason="verl's agent loop needs hydra-core (the test extra)")
pytest.importorskip("transfer_queue", reason="verl's v1 trainer imports TransferQueue (the test extra)")

from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker  # noqa: E402
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402
from verl.trainer.ppo.v1 import agent_loop_tq  # noqa: E402
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402

from retriever_server.sample_corpus import SAMPLE_FACTS  # noqa: E402
from tests.conftest import SAMPLE_RETRIEVAL  # noqa: E402
from tests.rollout.agent_helpers import sample_prompts  # noqa: E402
from vrag_rollout.config import AgentRolloutConfig  # noqa: E402
from vrag_rollout.devkit.demo import DEMO_MAX_PAGE, demo_config, demo_page_band, one_of, turn_regex  # noqa: E402
from vrag_rollout.integrations.verl.agent_loop import SAMPLE_COLUMN  # noqa: E402
from vrag_rollout.integrations.verl.guard import attach_turn_ids  # noqa: E402
from vrag_rollout.integrations.verl.local import local_worker, prompt_rows  # noqa: E402
from vrag_rollout.integrations.verl.segments import segment_tensors  # noqa: E402
from vrag_rollout.integrations.verl.v1_rows import SegmentRowsWorker  # noqa: E402
from vrag_rollout.verify.check import check_batch  # noqa: E402
from vrag_rollout.verify.saved_batch import from_dataproto  # noqa: E402

SEARCH = turn_regex("tags", one_of(sorted(SAMPLE_FACTS)), DEMO_MAX_PAGE, answer=False, fetch=False)
# turn 1 searches (two pages), later turns sample freely; the last page only stays: 2 rows an episode
FREE = dict(context_keep_pages=1, top_n=2, max_turns=3, response_length=400, action_regex=None,
            first_turn_action_regex=SEARCH)
# a search every turn, the last turn's pages only stay: edits before turns 3 and 4, 3 rows an episode
EVERY_TURN = dict(context_keep_turns=1, top_n=2, max_turns=4, response_length=1024, action_regex=SEARCH,
                  first_turn_action_regex=None)
TRAINER = {"trainer": {"use_v1": True}, "algorithm": {"adv_estimator": "grpo"},
           "actor_rollout_ref": {"actor": {"loss_agg_mode": "token-mean"}}}
# the test's reward, by episode (its `vrag_sample`): read by verl's reward manager from the last row
REWARDS = {0: 1.0, 1: 1.0, 2: 0.5, 3: 0.0, 10: 0.0}

V1_WORKER = agent_loop_tq.AgentLoopWorkerTQ.__ray_metadata__.modified_class  # the class its Ray actor runs


class QueueKV:
    """TransferQueue's key-value calls the v1 worker makes, held in memory: key -> stored row."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}
        self.tags: dict[str, dict] = {}

    async def async_kv_put(self, key, partition_id, tag=None, **_):
        self.tags[key] = tag

    async def async_kv_batch_put(self, keys, fields, tags, partition_id):
        for i, key in enumerate(keys):
            self.rows[key] = {name: fields[name][i] for name in fields.keys()}
            self.tags[key] = tags[i]

    def batch_get(self, keys, select_fields):
        """As `tq.kv_batch_get`: the rows' fields as one TensorDict."""
        rows = [{name: self.rows[key][name] for name in select_fields} for key in keys]
        for row in rows:  # a stored non-tensor reads back as its value
            for name, value in row.items():
                if not isinstance(value, torch.Tensor):
                    row[name] = getattr(value, "data", value)
        return list_of_dict_to_tensordict(rows)


class Recording:
    """A worker recording what each trajectory handed its `_agent_loop_postprocess`."""

    async def _agent_loop_postprocess(self, output, validate, **kwargs):
        self.handed.append((output, kwargs))
        return await super()._agent_loop_postprocess(output, validate, **kwargs)


class RecordingV1Worker(Recording, ray.remote(SegmentRowsWorker).__ray_metadata__.modified_class):
    """The rows worker (`SegmentRowsWorker`, unguarded), as its Ray actor runs it."""


class RecordingPlainV1Worker(Recording, V1_WORKER):
    """verl's own v1 worker, as its Ray actor runs it."""


def reward_by_episode(data_source, solution_str, ground_truth, extra_info=None, **_):
    return REWARDS.get(extra_info.get("episode_id"), 0.0)  # no episode_id: one row, no context policy


class LocalRewardWorker:
    """A reward-loop worker handle (`compute_score.remote(data)`) running verl's NaiveRewardManager here."""

    def __init__(self, tokenizer):
        async def remote(data):  # the manager holds the event loop it was made in: made in the caller's
            return await NaiveRewardManager(OmegaConf.create({}), tokenizer, reward_by_episode).run_single(data)

        self.compute_score = SimpleNamespace(remote=remote)


def settings_for(processor, **overrides) -> dict:
    config = demo_config(**demo_page_band(processor), action_format="tags", n=1,
                         retriever_fixtures=str(SAMPLE_RETRIEVAL), **overrides)
    return {k: v for k, v in dataclasses.asdict(config).items() if v is not None}


def v1_worker(model_dir, llm, settings, trainer=TRAINER, worker_class=RecordingV1Worker):
    worker = local_worker(model_dir, llm, settings, worker_class=worker_class)
    worker.config = OmegaConf.merge(worker.config, trainer)
    worker.rollout_config = worker.config.actor_rollout_ref.rollout
    worker.reward_loop_worker_handles = [LocalRewardWorker(worker.tokenizer)]
    worker.handed = []
    return worker


def prompt_kwargs(samples, uid_of=lambda i: f"q{i}") -> list[dict]:
    rows = prompt_rows(samples, "tags")
    out = []
    for i in range(len(rows)):
        kwargs = {k: v[i] for k, v in rows.non_tensor_batch.items()}
        kwargs.update(uid=uid_of(i), global_steps=1, reward_model={"ground_truth": "{}", "style": "rule"})
        kwargs.pop(SAMPLE_COLUMN)
        out.append(kwargs)
    return out


def run_sessions(worker, prompts: list[dict], n: int, first_sample: int = 0, first_session: int = 0) -> None:
    """As the v1 worker's `_run_prompt`: n sessions of each prompt, each its own `_run_agent_loop`
    (here each with its own sample number, for seeds and the test's rewards)."""
    config = worker.rollout_config
    params = dict(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k, repetition_penalty=1.0,
                  logprobs=config.calculate_log_probs)

    async def session(prompt: dict, i: int, sample: int):
        kwargs = {**prompt, "extra_info": dict(prompt["extra_info"]), SAMPLE_COLUMN: sample}
        trajectory = {"step": 1, "sample_index": prompt["index"], "rollout_n": i, "validate": False}
        await worker._run_agent_loop(dict(params), trajectory, trace=False, session_id=i, **kwargs)

    async def everything():
        await asyncio.gather(*(session(prompt, first_session + i, first_sample + p * n + i)
                               for p, prompt in enumerate(prompts) for i in range(n)))

    asyncio.run(everything())


@pytest.fixture(scope="module")
def rollouts(tiny_model_dir, tiny_processor, tiny_llm):
    """Both rollouts into one in-memory TransferQueue: FREE (2 prompts x n=2, samples 0-3, uids q0
    q1) and EVERY_TURN (one more session of q0's prompt, sample 10, session 2)."""
    kv = QueueKV()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(agent_loop_tq, "tq", kv)
        free_settings = settings_for(tiny_processor, **FREE)
        free = v1_worker(tiny_model_dir, tiny_llm, free_settings)
        run_sessions(free, prompt_kwargs(sample_prompts(2, with_images=False)), n=2)
        every = v1_worker(tiny_model_dir, tiny_llm, settings_for(tiny_processor, **EVERY_TURN))
        run_sessions(every, prompt_kwargs(sample_prompts(1, with_images=False)), n=1, first_sample=10,
                     first_session=2)
    return SimpleNamespace(kv=kv, free=free, every=every, handed=free.handed + every.handed,
                           free_config=AgentRolloutConfig(**free_settings))


def test_each_episode_is_handed_over_as_its_rows_in_order(rollouts):
    rows_per_episode = []
    for outputs, kwargs in rollouts.handed:
        assert isinstance(outputs, list) and all(isinstance(o, AgentLoopOutput) for o in outputs)
        fields = [o.extra_fields for o in outputs]
        assert [f["segment_index"] for f in fields] == list(range(len(outputs)))
        assert len({f["episode_id"] for f in fields}) == 1 and fields[0]["episode_id"] == kwargs[SAMPLE_COLUMN]
        assert [f["termination_reason"] for f in fields[:-1]] == ["context_edit"] * (len(outputs) - 1)
        assert fields[-1]["termination_reason"] != "context_edit" and fields[0]["context_length"] == 0
        for before, after in zip(outputs, outputs[1:]):
            context = after.extra_fields["context_length"]
            assert 0 < context < len(after.response_ids)
            assert after.response_mask[:context] == [0] * context  # the context is out of the loss
            assert after.response_logprobs[:context] == [0.0] * context
            assert sum(after.extra_fields["sampled_mask"][:context]) == sum(before.extra_fields["sampled_mask"])
        # verl's reward manager scored the last row; the v1 worker copied it to the earlier ones
        assert [o.reward_score for o in outputs] == [REWARDS[kwargs[SAMPLE_COLUMN]]] * len(outputs)
        keys = [f"{kwargs['uid']}_{kwargs['session_id']}_{i}" for i in range(len(outputs))]
        assert all(key in rollouts.kv.rows and rollouts.kv.tags[key]["status"] == "success" for key in keys)
        rows_per_episode.append(len(outputs))
    assert rows_per_episode == [2, 2, 2, 2, 3], rows_per_episode  # FREE's four episodes, EVERY_TURN's one
    assert len(rollouts.kv.rows) == sum(rows_per_episode)


def test_verls_own_scoring_of_rows_fails_where_the_rows_worker_scores_the_last(rollouts):
    """Why the rows worker: verl 0.9.1's `_compute_score` pads the rows' (4, L) positions
    together and fails on rows of different lengths; the rows worker's scores the last row, the
    one verl's reward managers read, and gives the reward the v1 worker stored."""
    outputs, kwargs = rollouts.handed[0]
    rows = [output.model_copy(deep=True) for output in outputs]
    for row in rows:
        row.reward_score = None
    with pytest.raises(RuntimeError, match="must match the size"):
        asyncio.run(AgentLoopWorker._compute_score(rollouts.free, rows, kwargs=kwargs))
    asyncio.run(rollouts.free._compute_score(rows, kwargs=kwargs))
    assert rows[-1].reward_score == REWARDS[kwargs[SAMPLE_COLUMN]] and rows[0].reward_score is None


def rope_positions(model_dir, processor, ids: torch.Tensor, grids):
    """transformers' own `get_rope_index` of an unpadded row: the positions verl must store for it."""
    from transformers import AutoConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    with torch.device("meta"):
        rope = Qwen2VLModel(AutoConfig.from_pretrained(model_dir))
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    types = torch.zeros_like(ids, dtype=torch.int32)
    types[ids == pad] = 1
    extra = {"mm_token_type_ids": types[None]} \
        if "mm_token_type_ids" in inspect.signature(rope.get_rope_index).parameters else {}
    expected, _ = rope.get_rope_index(input_ids=ids[None], image_grid_thw=grids,
                                      attention_mask=torch.ones_like(ids)[None], **extra)
    return expected[:, 0]



def test_each_stored_row_has_transformers_positions_and_the_processors_image_runs(rollouts, tiny_model_dir,
                                                                                  tiny_processor):
    """What the v1 worker stored for each row (verl's `_compute_multi_modal_inputs` and
    `_compute_position_ids` on that row alone) against transformers' own `get_rope_index` of the
    row and the processor's grids of the row's images: a row given another row's images, or an
    image's pad run of the wrong size, fails here."""
    pad = tiny_processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    merge = tiny_processor.image_processor.merge_size ** 2
    images_seen = 0
    for outputs, kwargs in rollouts.handed:
        for i, output in enumerate(outputs):
            stored = rollouts.kv.rows[f"{kwargs['uid']}_{kwargs['session_id']}_{i}"]
            ids = torch.tensor(output.prompt_ids + output.response_ids)
            assert torch.equal(stored["input_ids"], ids)
            assert torch.equal(stored["loss_mask"], torch.tensor(output.response_mask))
            images = (output.multi_modal_data or {}).get("images") or []
            grids = tiny_processor.image_processor(images=images, return_tensors="pt")["image_grid_thw"] if images \
                else None
            runs = [len(run) for run in "".join("x" if t == pad else " " for t in ids.tolist()).split()]
            assert runs == ([int(g.prod()) // merge for g in grids] if images else []), (kwargs["uid"], i)
            inputs = stored["multi_modal_inputs"]
            inputs = getattr(inputs, "data", inputs)
            if images:
                assert torch.equal(inputs["image_grid_thw"], grids)
            expected = rope_positions(tiny_model_dir, tiny_processor, ids, grids)
            assert torch.equal(stored["position_ids"][1:], expected), (kwargs["uid"], i)
            assert torch.equal(stored["position_ids"][0], torch.arange(len(ids)))
            images_seen += len(images)
    assert images_seen > 0


def padded_batch(worker, handed) -> DataProto:
    """The rows as one padded DataProto: each output through verl's one-output postprocessing
    (`AgentLoopWorker._agent_loop_postprocess`: padding, processor inputs, positions), then verl's
    `_postprocess`; the extra fields become columns, readable by `check` (`segment_tensors`)."""

    async def pad_all():
        return [await AgentLoopWorker._agent_loop_postprocess(worker, output, False, **kwargs)
                for outputs, kwargs in handed for output in outputs]

    batch = AgentLoopWorker._postprocess(worker, asyncio.run(pad_all()))
    batch.non_tensor_batch["uid"] = np.array([kwargs["uid"] for outputs, kwargs in handed for _ in outputs],
                                             dtype=object)
    assert attach_turn_ids(batch) and segment_tensors(batch)
    return batch


def test_the_rows_pass_check_with_the_forward_pass(rollouts, tiny_model_dir, tmp_path, capsys):
    from vrag_rollout.cli import main as cli_main

    free = [(outputs, kwargs) for outputs, kwargs in rollouts.handed if kwargs[SAMPLE_COLUMN] < 10]
    batch = padded_batch(rollouts.free, free)
    # the batch's own `rollout_meta` column says the grammar held turn 1 only (no config given)
    saved = from_dataproto(batch, model_path=tiny_model_dir)
    report = check_batch(saved, tiny_model_dir, forward=True)
    assert report.ok, report.human()
    assert "4 episodes in 8 rows (4 cut by context edits)" in report.human()
    # the turns after the first, each row's own after an edit, were sampled freely on the row as
    # stored: compared with the forward pass, not excused
    assert report.forward["free_tokens"] > 0 and report.forward["free_max_gap"] < 1e-3
    every = [(outputs, kwargs) for outputs, kwargs in rollouts.handed if kwargs[SAMPLE_COLUMN] >= 10]
    report = check_batch(from_dataproto(padded_batch(rollouts.every, every), model_path=tiny_model_dir),
                         tiny_model_dir)
    assert report.ok, report.human()
    # the control: a row whose context keeps a log-prob of the row it came from is caught
    row = 1
    context = int(batch.non_tensor_batch["context_length"][row])
    sampled = batch.batch["sampled_mask"][row, :context].nonzero().flatten()
    batch.batch["rollout_log_probs"][row, sampled[0]] = -0.5
    path = tmp_path / "rows.pkl"
    batch.save_to_disk(str(path))
    assert cli_main(["check", str(path), "--model", str(tiny_model_dir)]) == 1
    assert "a rollout log-prob inside the row's context" in capsys.readouterr().out


def test_grpo_counts_each_episode_once_whatever_its_rows(rollouts):
    """verl's v1 advantage step on the stored rows: group q0 holds episodes of 2, 2 and 3 rows.
    Every row of an episode gets its episode's advantage, GRPO over the episodes' rewards; verl's
    row-based `compute_advantage` (what any other estimator gets) counts the 3-row episode 3 times."""
    kv = rollouts.kv
    keys = sorted(kv.rows)
    data = kv.batch_get(keys, ["uid", "response_mask", "rm_scores"])
    data = DataProto(batch=data.to_padded_tensor())  # as the v1 trainer's _compute_advantage reads them
    data.batch["token_level_scores"] = data.batch["rm_scores"]
    data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    by_row = compute_advantage(DataProto(batch=data.batch.clone(), non_tensor_batch=dict(data.non_tensor_batch)),
                               adv_estimator="grpo")
    out = compute_advantage_for_multi_trajectories(data, batch_keys=keys, adv_estimator="grpo")

    episodes: dict[str, list[int]] = {}
    for row, key in enumerate(keys):
        episodes.setdefault(key.rsplit("_", 1)[0], []).append(row)
    sample_of = {f"{kwargs['uid']}_{kwargs['session_id']}": kwargs[SAMPLE_COLUMN] for _, kwargs in rollouts.handed}
    groups: dict[str, list[str]] = {}
    for episode in episodes:
        groups.setdefault(episode.split("_")[0], []).append(episode)
    assert sorted(len(episodes[e]) for e in groups["q0"]) == [2, 2, 3]
    for members in groups.values():
        scores = torch.tensor([REWARDS[sample_of[e]] for e in members])
        expected = (scores - scores.mean()) / (scores.std() + 1e-6)  # GRPO over episodes, one score each
        for episode, advantage in zip(members, expected):
            for row in episodes[episode]:
                mask = out.batch["response_mask"][row].bool()
                assert mask.any()
                assert torch.allclose(out.batch["advantages"][row][mask], advantage.expand(int(mask.sum())),
                                      atol=1e-5), (episode, row)
    # the pitfall it avoids: by rows, q0's 3-row episode (reward 0) is three of seven scores
    q0 = [row for e in groups["q0"] for row in episodes[e]]
    row_scores = torch.tensor([REWARDS[sample_of[keys[row].rsplit("_", 1)[0]]] for row in q0])
    assert len(row_scores) == 7 and float(row_scores.mean()) == pytest.approx(4 / 7)  # not the episodes' 2/3
    gaps = []
    for row, score in zip(q0, row_scores):
        mask = by_row.batch["response_mask"][row].bool()
        by_rows = by_row.batch["advantages"][row][mask][0].item()
        assert by_rows == pytest.approx(float((score - row_scores.mean()) / (row_scores.std() + 1e-6)), abs=1e-5)
        gaps.append(abs(by_rows - out.batch["advantages"][row][mask][0].item()))
    assert max(gaps) > 0.2


@pytest.mark.parametrize("trainer, worker_class, message", [
    (TRAINER, None, r"this agent-loop worker \(GuardedAgentLoopWorker\) takes exactly one output per trajectory.*"
                    r"trainer\.use_v1=True.*agent_loop_manager_class=vrag_rollout\.integrations\.verl\.v1_rows\."
                    r"GuardedRowsManager"),
    (TRAINER, RecordingPlainV1Worker, r"\(RecordingPlainV1Worker\) scores them with verl 0\.9\.1's "
                                      r"AgentLoopWorker\._compute_score.*agent_loop_manager_class="),
    ({**TRAINER, "actor_rollout_ref": {"actor": {"loss_agg_mode": "seq-mean-token-mean"}}}, RecordingV1Worker,
     r"loss_agg_mode=seq-mean-token-mean weighs each row.*actor_rollout_ref\.actor\.loss_agg_mode=token-mean"),
    ({**TRAINER, "algorithm": {"adv_estimator": "rloo"}}, RecordingV1Worker,
     r"adv_estimator=rloo is computed by verl per row.*algorithm\.adv_estimator=grpo"),
    ({"trainer": {"use_v1": True}}, RecordingV1Worker, r"adv_estimator=gae"),  # verl's default estimator
    ({**TRAINER, "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": True}}, RecordingV1Worker,
     r"use_kl_in_reward=True puts a KL penalty in every row's reward.*use_kl_loss=True"),
], ids=["legacy-worker", "verls-v1-worker", "seq-mean", "rloo", "default-gae", "kl-in-reward"])
def test_a_trainer_that_would_weigh_rows_is_refused_before_sampling(trainer, worker_class, message, tiny_model_dir,
                                                                    tiny_processor, tiny_llm):
    worker = v1_worker(tiny_model_dir, tiny_llm, settings_for(tiny_processor, **FREE), trainer=trainer,
                       worker_class=worker_class)
    with pytest.raises(Exception, match=f"(?s)vrag_agent: .*{message}") as caught:  # hydra wraps the loop's errors
        run_sessions(worker, prompt_kwargs(sample_prompts(1, with_images=False)), n=1)
    assert isinstance(caught.value, ValueError) or isinstance(caught.value.__cause__, ValueError)
    assert worker.llm_client.calls == 0 and worker.handed == []


def test_without_a_context_policy_the_output_is_one_row_as_before(tiny_model_dir, tiny_processor, tiny_llm):
    """The legacy worker takes it (nothing is refused), and the v1 worker is handed one output with
    the fields it always had (no segment fields)."""
    settings = settings_for(tiny_processor, **{**FREE, "context_keep_pages": 0, "max_turns": 2})
    legacy = local_worker(tiny_model_dir, tiny_llm, settings)
    batch = asyncio.run(legacy.generate_sequences(prompt_rows(sample_prompts(1, with_images=False), "tags")))
    assert len(batch) == 1 and "episode_id" not in batch.non_tensor_batch
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(agent_loop_tq, "tq", QueueKV())
        worker = v1_worker(tiny_model_dir, tiny_llm, settings)
        run_sessions(worker, prompt_kwargs(sample_prompts(1, with_images=False)), n=1)
    (output, _), = worker.handed
    assert isinstance(output, AgentLoopOutput)
    assert set(output.extra_fields) == {
        "termination_reason", "page_ids", "budget_overflow", "num_searches", "num_fetches", "num_crops",
        "retriever_errors", "bad_requests", "doc_id", "image_regions", "turn_ids", "rollout_meta",
        "multi_modal_data", "tool_extra_fields", "reward_extra_info"}
    assert output.response_mask == [int(m) for m in batch.batch["response_mask"][0][:len(output.response_ids)]]
