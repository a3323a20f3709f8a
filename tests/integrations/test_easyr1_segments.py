"""Segment rows through EasyR1's trainer (`integrations/easyr1/segments.py`), on a real rollout.

The rollout runs on the real engine with a context policy (episodes of several rows). What
EasyR1's batch-making code does with the generation (union with the prompts repeated n times,
group filtering by uid, the cut to rollout_batch_size x n) is done here with verl's DataProto,
which has EasyR1's API and checks (`union` refuses unequal sizes and unequal shared columns):
the trainer must see exactly prompts x n final rows, and the rows it keeps must come back as the
rollout wrote them, passing the project's `check` (tokens, grids, positions, forward pass).
`scripts/check_easyr1.py --context-keep-pages 1 --steps N` runs the same through EasyR1 itself.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from tests.rollout.agent_helpers import sample_prompts
from tests.rollout.test_context_segments import free_after_search
from tests.verify.helpers import N, roll
from vrag_rollout.integrations.easyr1 import segments
from vrag_rollout.integrations.easyr1.rollout_adapter import easyr1_masks
from vrag_rollout.verify.check import check_batch
from vrag_rollout.verify.saved_batch import load_rollout, save_rollout

PROMPTS = 3


@pytest.fixture(scope="module")
def rollout(family_models, tmp_path_factory):
    model = family_models("qwen2-vl")
    where = tmp_path_factory.mktemp("easyr1-segments")
    done = roll(model.model_dir, model.processor, model.llm, sample_prompts(PROMPTS), where / "rollout.pt",
                calculate_log_probs=True, context_keep_pages=1, **free_after_search("tags"))
    assert max(done.output.non_tensor_batch["segment_index"]) >= 1, "no edit happened: nothing would be proven"
    return model, done


def trainer_view(output):
    """The agent's output as EasyR1's worker hands it back: verl's DataProto, the loss mask as
    `response_mask` (the adapter)."""
    from verl.protocol import DataProto

    proto = DataProto.from_dict(tensors={k: v.clone() for k, v in output.batch.items()},
                                non_tensors={k: v.copy() for k, v in output.non_tensor_batch.items()},
                                meta_info=dict(output.meta_info))
    return easyr1_masks(proto)


def prompts_batch():
    """The trainer's batch after the generation pop: a uid and a ground truth per prompt."""
    from verl.protocol import DataProto

    return DataProto.from_dict(tensors={"prompt_index": torch.arange(PROMPTS)[:, None]}, non_tensors={
        "uid": np.array([f"u{i}" for i in range(PROMPTS)], dtype=object),
        "ground_truth": np.array([f"answer {i}" for i in range(PROMPTS)], dtype=object)})


class WorkerGroup:
    """Two data-parallel workers' outputs concatenated, as the trainer's dispatch returns them."""

    world_size = 2

    def __init__(self, output):
        self.output = output

    def generate_sequences(self, prompts):
        from verl.protocol import DataProto

        runs = segments.episode_runs(self.output)
        half = runs[len(runs) // 2][0]
        return DataProto.concat([self.output[list(range(half))], self.output[list(range(half, len(self.output)))]])


def make_batch(stash, output, kept_uids):
    """What `_make_batch_data` does with the generation, on final rows: union, filter, cut."""
    group = WorkerGroup(output)
    with stash.collapsing(group):
        final = group.generate_sequences(None)
    assert "generate_sequences" not in vars(group)  # restored
    batch = prompts_batch().repeat(repeat_times=N, interleave=True).union(final)
    kept = [row for row, uid in enumerate(batch.non_tensor_batch["uid"]) if uid in kept_uids]
    return final, batch[kept][: len(kept)]


def test_the_trainer_sees_final_rows_and_gets_every_kept_episode_back_as_rolled_out(rollout, tmp_path):
    model, done = rollout
    output = trainer_view(done.output)
    stash = segments.SegmentStash()
    final, batch = make_batch(stash, output, kept_uids={"u0", "u2"})
    runs = segments.episode_runs(output)
    assert len(final) == PROMPTS * N and len(runs) == PROMPTS * N < len(output)
    assert list(final.non_tensor_batch["termination_reason"]).count("context_edit") == 0
    batch.batch["token_level_scores"] = torch.ones_like(batch.batch["response_mask"], dtype=torch.float32)

    expanded = stash.expand(batch)
    kept_rows = [row for run in runs if int(output.non_tensor_batch["episode_id"][run[-1]]) // N in (0, 2)
                 for row in run]
    assert len(expanded) == len(kept_rows) > len(batch)
    for key in output.batch.keys():  # every row is the rollout's own, in its order
        assert torch.equal(expanded.batch[key], output.batch[key][kept_rows]), key
    for key in ("episode_id", "segment_index", "context_length", "termination_reason"):
        assert list(expanded.non_tensor_batch[key]) == list(output.non_tensor_batch[key][kept_rows]), key
    for a, b in zip(expanded.non_tensor_batch["multi_modal_data"], output.non_tensor_batch["multi_modal_data"][kept_rows]):
        assert [e.key for e in a["images"][1:]] == [e.key for e in b["images"][1:]]
    # the trainer's columns come from the episode's final row; the episode's score is on that row only
    prompt_of = {int(e) // N for e in expanded.non_tensor_batch["episode_id"]}
    assert prompt_of == {0, 2}
    assert [u for u in expanded.non_tensor_batch["uid"]] == [f"u{int(e) // N}" for e in expanded.non_tensor_batch["episode_id"]]
    closed = expanded.non_tensor_batch["termination_reason"] == "context_edit"
    scores = expanded.batch["token_level_scores"].sum(-1)
    assert closed.any() and bool((scores[closed] == 0).all()) and bool((scores[~closed] > 0).all())

    # what the trainer trains on passes the project's check: tokens, grids, positions, forward pass
    save_rollout(expanded, tmp_path / "trainer.pt", processor=model.processor, model_path=model.model_dir,
                 config=done.config)
    report = check_batch(load_rollout(tmp_path / "trainer.pt"), model.model_dir, forward=True)
    assert report.ok, report.human()
    assert report.forward["free_tokens"] > 0 and report.forward["free_max_gap"] < 1e-3


def test_a_rollout_without_segment_columns_or_out_of_order_rows_is_refused(rollout):
    _, done = rollout
    output = trainer_view(done.output)
    plain = output[list(range(len(output)))]
    del plain.non_tensor_batch["segment_index"]
    with pytest.raises(ValueError, match="no `segment_index` column"):
        segments.episode_runs(plain)
    runs = segments.episode_runs(output)
    split = next(run for run in runs if len(run) > 1)
    shuffled = output[[r for r in range(len(output)) if r != split[0]] + [split[0]]]
    with pytest.raises(ValueError, match="does not follow|end in a context edit"):
        segments.episode_runs(shuffled)


def test_pads_fill_the_divisors_and_sit_last_in_every_rank_share(rollout):
    _, done = rollout
    batch = trainer_view(done.output)
    config = types.SimpleNamespace(worker=types.SimpleNamespace(
        actor=types.SimpleNamespace(global_batch_size=2, ulysses_size=1, micro_batch_size_per_device_for_experience=4,
                                    micro_batch_size_per_device_for_update=1),
        rollout=types.SimpleNamespace(n=N)))
    multiple = segments.row_multiple(config, world_size=2)
    assert multiple == 8  # lcm(2 ranks, 2 x n mini-batch rows, 2 ranks x 4 micro rows)
    rows = len(batch)
    padded = segments.pad_rows(batch, multiple)
    pads = padded.non_tensor_batch[segments.PAD_KEY]
    assert len(padded) % multiple == 0 and int(pads.sum()) == len(padded) - rows
    for key in ("response_mask", "loss_mask"):
        assert int(padded.batch[key][pads].sum()) == 0
    padded.reorder(torch.tensor(list(reversed(range(len(padded))))))  # the balance may put pads anywhere
    segments.pads_last(padded, world_size=2)
    flags = padded.non_tensor_batch[segments.PAD_KEY]
    share = len(padded) // 2
    for start in (0, share):
        part = list(flags[start:start + share])
        assert part == sorted(part), "a pad before a real row in a rank's share"
    assert segments.final_rows(padded) == [r for r in range(len(padded)) if not flags[r]
                                          and padded.non_tensor_batch["termination_reason"][r] != "context_edit"]


def test_each_episode_enters_its_group_once_with_every_rows_reward(rollout):
    """GRPO over episodes (verl's own function as the estimator), each episode scored by the sum of
    its rows' token rewards (a KL penalty on its earlier rows included); against GRPO computed by
    hand on one score per episode, and unlike GRPO over rows."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    _, done = rollout
    batch = trainer_view(done.output)
    runs = segments.episode_runs(batch)
    batch.non_tensor_batch[segments.EPISODE_KEY] = np.array(
        [k for k, run in enumerate(runs) for _ in run], dtype=np.int64)
    batch.non_tensor_batch["uid"] = np.array([f"u{k // N}" for k, run in enumerate(runs) for _ in run], dtype=object)
    generator = torch.Generator().manual_seed(0)
    rewards = -0.01 * torch.rand(batch.batch["response_mask"].shape, generator=generator) * batch.batch["response_mask"]
    finals = [run[-1] for run in runs]
    outcome = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5])[: len(runs)]
    for episode, row in enumerate(finals):
        last = int(batch.batch["response_mask"][row].nonzero().max())
        rewards[row, last] += outcome[episode]
    batch.batch["token_level_rewards"] = rewards

    advantages = segments.episode_advantages(batch, compute_grpo_outcome_advantage)

    score = torch.tensor([float(rewards[run].sum()) for run in runs], dtype=torch.float64)
    for k, run in enumerate(runs):
        group = score[(k // N) * N:(k // N + 1) * N]
        expected = float((score[k] - group.mean()) / (group.std() + 1e-6))
        for row in run:
            mask = batch.batch["response_mask"][row].bool()
            assert torch.allclose(advantages[row][mask], torch.full((int(mask.sum()),), expected), atol=1e-5)
            assert bool((advantages[row][~mask] == 0).all())
    by_rows, _ = compute_grpo_outcome_advantage(rewards, batch.batch["response_mask"], batch.non_tensor_batch["uid"])
    split = next(run for run in runs if len(run) > 1)
    assert not torch.allclose(by_rows[split[-1]], advantages[split[-1]], atol=1e-3), "rows would have done as well"


def test_the_steps_metrics_are_computed_on_episodes(rollout):
    _, done = rollout
    batch = segments.pad_rows(trainer_view(done.output), 4)
    batch.non_tensor_batch[segments.EPISODE_KEY] = np.arange(len(batch))
    seen = []
    metrics = segments.make_data_metrics(lambda b, use_critic=False: seen.append(len(b)) or {"rows": len(b)})
    assert metrics(batch, use_critic=False) == {"rows": PROMPTS * N} and seen == [PROMPTS * N]
    del batch.non_tensor_batch[segments.EPISODE_KEY]
    assert metrics(batch) == {"rows": len(batch)}  # without segments: EasyR1's own function, unchanged


def test_the_guards_counts_cover_every_real_row(rollout):
    """The guard's metrics (its wrapper inside, as installed) count every row it checked, pads not."""
    from vrag_rollout.integrations.easyr1.guard import patch_trainer_metrics
    from vrag_rollout.verify.guard import Guard, LiveGuard

    model, done = rollout
    output = trainer_view(done.output)
    LiveGuard(Guard(model.model_dir), "drop", config=done.config)(output)  # as the adapter runs it
    module = types.SimpleNamespace(compute_data_metrics=lambda b, use_critic=False: {"rows": len(b)})
    patch_trainer_metrics(module)
    batch = segments.pad_rows(output, 4)
    batch.non_tensor_batch[segments.EPISODE_KEY] = np.arange(len(batch))
    found = segments.make_data_metrics(module.compute_data_metrics)(batch, use_critic=False)
    assert found["rows"] == PROMPTS * N
    assert found.get("guard/checked") == len(done.output) > PROMPTS * N, found


def test_a_context_policy_refuses_row_weighted_losses_and_non_outcome_estimators():
    def config(estimator="grpo", mode="token", keep=2):
        rollout = types.SimpleNamespace(edits_context=keep > 0, n=N)
        return types.SimpleNamespace(algorithm=types.SimpleNamespace(adv_estimator=estimator),
                                     worker=types.SimpleNamespace(rollout=rollout,
                                                                  actor=types.SimpleNamespace(loss_avg_mode=mode)))

    assert segments.segment_problems(config()) == []
    assert segments.segment_problems(config("rloo")) == []
    assert segments.segment_problems(config("reinforce_plus_plus", "seq", keep=0)) == []
    found = segments.segment_problems(config("reinforce_plus_plus", "seq"))
    assert len(found) == 2
    assert "reinforce_plus_plus" in found[0] and "grpo, rloo, grpo_passk" in found[0]
    assert "loss_avg_mode=seq" in found[1] and "loss_avg_mode=token" in found[1]
