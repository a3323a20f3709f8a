"""Turn-level credit on a batch (`training/turn_credit.py`) and its independent check
(`training/credit_check.py`), on a batch laid out as the rollout lays it out (`turn_ids` from 1
with each observation in its turn, `loss_mask` 0 on observations and padding, `turn_page_ids`):

- per-turn rewards off and estimator `grpo`: advantages through `grpo_loss`'s dispatch
  (`grpo.estimator_advantages`) bit-identical to today's (`grpo.grpo_advantages`) and to verl's `compute_grpo_outcome_advantage` called as verl's trainer
  calls it;
- the check passes the real credit of every estimator and names the planted mistakes: an
  advantage on an observation token, a turn's reward given to the next turn."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vrag_rollout.core.turn_rewards import PRESETS, turn_rewards
from vrag_rollout.training.credit_check import check_credit
from vrag_rollout.training.grpo import estimator_advantages, grpo_advantages
from vrag_rollout.training.turn_credit import credit_values


def credit_advantages(estimator, batch, rewards, n, turn_rewards):
    """The dispatch `grpo_loss` calls (training/grpo.py)."""
    return estimator_advantages(batch, rewards, n, "loss_mask", estimator, turn_rewards)

N = 2
TRUTHS = [{"answer": "2 4", "doc_id": "doc", "gold_pages": [2, 4]}, {"answer": "3", "doc_id": "other", "gold_pages": [3]}]
# per row: per turn (sampled tokens, observation tokens, pages shown after it)
EPISODES = [
    [(3, 2, ["doc_2"]), (2, 2, ["doc_4"]), (2, 0, [])],
    [(2, 2, ["doc_1"]), (3, 2, ["doc_1"]), (1, 0, [])],
    [(2, 2, ["other_3"]), (2, 0, [])],
    [(4, 0, [])],
]
WIDTH = 16
SCORES = [{"overall": 0.9, "accuracy": 1.0, "f1": 1.0, "format": 1.0, "retrieval": 1.0},
          {"overall": 0.1, "accuracy": 0.0, "f1": 0.0, "format": 1.0, "retrieval": 0.0},
          {"overall": 1.0, "accuracy": 1.0, "f1": 1.0, "format": 1.0, "retrieval": 1.0},
          {"overall": 0.8, "accuracy": 1.0, "f1": 1.0, "format": 0.0, "retrieval": 0.0}]


def layout_batch():
    turn_ids = torch.zeros(len(EPISODES), WIDTH, dtype=torch.long)
    loss_mask = torch.zeros(len(EPISODES), WIDTH, dtype=torch.long)
    response_mask = torch.zeros(len(EPISODES), WIDTH, dtype=torch.long)
    for row, turns in enumerate(EPISODES):
        col = 0
        for turn, (sampled, observed, _) in enumerate(turns, start=1):
            turn_ids[row, col:col + sampled + observed] = turn
            loss_mask[row, col:col + sampled] = 1
            response_mask[row, col:col + sampled + observed] = 1
            col += sampled + observed
    pages = np.empty(len(EPISODES), dtype=object)
    pages[:] = [[list(t[2]) for t in turns] for turns in EPISODES]
    return SimpleNamespace(batch={"turn_ids": turn_ids, "loss_mask": loss_mask, "response_mask": response_mask},
                           non_tensor_batch={"turn_page_ids": pages}, meta_info={})


def rewards_of(batch, preset):
    pages = batch.non_tensor_batch["turn_page_ids"]
    return [turn_rewards(pages[row], SCORES[row], TRUTHS[row // N], PRESETS[preset]).total for row in range(len(pages))]


def test_grpo_with_turn_rewards_off_is_bit_identical_to_today_and_to_verl():
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    batch = layout_batch()
    overall = [s["overall"] for s in SCORES]
    today = grpo_advantages(batch, overall, N)
    ours = credit_advantages("grpo", batch, overall, N, turn_rewards=rewards_of(batch, "off"))
    assert torch.equal(ours, today)
    # verl's trainer: the score on the last response token, uid per prompt, the policy's tokens as mask
    scores = torch.zeros(len(overall), WIDTH)
    for row, score in enumerate(overall):
        scores[row, int(batch.batch["response_mask"][row].nonzero().max())] = score
    verl, _ = compute_grpo_outcome_advantage(token_level_rewards=scores, response_mask=batch.batch["loss_mask"],
                                             index=np.array([f"uid{row // N}" for row in range(len(overall))], dtype=object),
                                             norm_adv_by_std_in_grpo=True)
    assert torch.equal(ours, verl)


@pytest.mark.parametrize("estimator", ["grpo", "turn", "gigpo"])
@pytest.mark.parametrize("preset", ["off", "retrieval", "on"])
def test_the_check_passes_real_credit(estimator, preset):
    batch = layout_batch()
    weights = {**PRESETS[preset].__dict__, "repeat_query": 0.0, "invalid": 0.0}  # the text-free parts
    from vrag_rollout.core.turn_rewards import TurnRewardWeights

    weights = TurnRewardWeights(**weights)
    pages = batch.non_tensor_batch["turn_page_ids"]
    rewards = [turn_rewards(pages[r], SCORES[r], TRUTHS[r // N], weights).total for r in range(len(pages))]
    advantages = credit_advantages(estimator, batch, [s["overall"] for s in SCORES], N, turn_rewards=rewards)
    assert check_credit(batch, TRUTHS, SCORES, rewards, advantages, estimator, N, weights) == []
    if estimator != "grpo":
        assert advantages.abs().sum() > 0


@pytest.mark.parametrize("estimator", ["grpo", "turn", "gigpo"])
def test_an_advantage_on_an_observation_token_is_caught(estimator):
    batch = layout_batch()
    rewards = rewards_of(batch, "on")
    advantages = credit_advantages(estimator, batch, [s["overall"] for s in SCORES], N, turn_rewards=rewards)
    observation = (batch.batch["turn_ids"] > 0) & (batch.batch["loss_mask"] == 0)
    row, col = observation.nonzero()[0].tolist()
    advantages[row, col] = 0.5
    problems = check_credit(batch, TRUTHS, SCORES, rewards, advantages, estimator, N, "on")
    assert problems and all(f"row {row} token {col}" in p for p in problems), problems
    assert "not sampled by the policy" in problems[0]


@pytest.mark.parametrize("estimator", ["turn", "gigpo"])
def test_a_turns_reward_given_to_the_next_turn_is_caught(estimator):
    batch = layout_batch()
    rewards = rewards_of(batch, "retrieval")
    assert rewards[0][0] > 0  # row 0's turn 1 showed gold page 2
    shifted = [[0.0] + row[:-2] + [row[-2] + row[-1]] if len(row) > 1 else row for row in rewards]
    assert [sum(r) for r in shifted] == pytest.approx([sum(r) for r in rewards])  # same episode totals
    advantages = credit_advantages(estimator, batch, [s["overall"] for s in SCORES], N, turn_rewards=shifted)
    problems = check_credit(batch, TRUTHS, SCORES, shifted, advantages, estimator, N, "retrieval")
    assert any(p.startswith("row 0 turn 1: reward 0.000000") for p in problems), problems
    if estimator == "turn":  # gigpo: row 0's later turns are step groups of one, so the same values here
        assert any("advantage" in p for p in problems)  # and the advantages they led to
        # the rewards right but the advantages from the shifted ones: still caught
        problems = check_credit(batch, TRUTHS, SCORES, rewards, advantages, estimator, N, "retrieval")
        assert problems and all("advantage" in p for p in problems)


def test_the_turn_estimator_credits_the_turn_that_found_the_page():
    """Row 0 found both gold pages (turns 1, 2), row 1 showed a distractor twice: row 0's first
    turn is ahead of row 1's by what it earned from then on."""
    batch = layout_batch()
    values = credit_values("turn", batch, rewards_of(batch, "on"), N)
    assert values[0][0] > 0 > values[1][0]
    assert values[1][1] < values[1][0] + 1e-12 or values[1][1] < 0  # the repeat was paid for


def test_the_learn_loops_metrics_line_carries_the_estimator_and_per_turn_metrics():
    """`training/learn.py`: a line is `STEP_FIELDS` then `Credit.metrics`; `check_record` takes it
    (the estimator's name is the one string) and refuses any other extra field."""
    from vrag_rollout.training.learn import STEP_FIELDS, LearnError, check_record
    from vrag_rollout.training.turn_credit import Credit

    batch = layout_batch()
    credit = Credit("gigpo", "on", tokenizer=None, truths=TRUTHS)
    turns = [turn_rewards(batch.non_tensor_batch["turn_page_ids"][r], SCORES[r], TRUTHS[r // N], PRESETS["on"])
             for r in range(len(SCORES))]
    metrics = credit.metrics(batch, turns, N)
    assert metrics["estimator"] == "gigpo"
    assert metrics["reward/turn/1/mean"] == pytest.approx(sum(t.total[0] for t in turns) / len(turns))
    assert metrics["reward/turn/3/mean"] == pytest.approx((turns[0].total[2] + turns[1].total[2]) / 2)
    assert {"advantage/turn/1/mean", "advantage/turn/3/std", "reward/turn/new_gold/mean"} <= set(metrics)
    record = {**dict.fromkeys(STEP_FIELDS, 0.0), **metrics}
    check_record(record)
    with pytest.raises(LearnError):
        check_record({**record, "surprise": 1.0})
    with pytest.raises(LearnError):
        check_record({**record, "reward/turn/1/mean": float("nan")})


@pytest.mark.parametrize("estimator", ["turn", "gigpo"])
def test_the_trainers_entry_point_with_per_turn_rewards_passes_the_check(estimator):
    """`trainer_credit` (what the EasyR1 and verl estimators call): the score on the last sampled
    token, the turns' pages and the ground truth in, per-turn rewards `retrieval` made of them."""
    from vrag_rollout.core.reward import (
        GroundTruth,
        parse_ground_truth,
        retrieval_score,
    )
    from vrag_rollout.training.estimators import turn_rewards_from_tokens
    from vrag_rollout.training.turn_credit import trainer_credit

    batch = layout_batch()
    mask, pages = batch.batch["loss_mask"], batch.non_tensor_batch["turn_page_ids"]
    scores = []
    for row, score in enumerate(SCORES):
        truth = parse_ground_truth(TRUTHS[row // N])
        shown = tuple(tuple(t) for t in pages[row])
        scores.append({**score, "retrieval": retrieval_score(GroundTruth(truth.answer, truth.doc_id, truth.gold_pages, shown))})
    token_rewards = torch.zeros(mask.shape)
    for row, score in enumerate(scores):
        token_rewards[row, int(mask[row].nonzero().max())] = score["overall"]
    columns = {"turn_page_ids": pages, "ground_truth": [json.dumps(TRUTHS[r // N]) for r in range(len(SCORES))]}
    advantages, metrics = trainer_credit(estimator, token_rewards, mask, [r // N for r in range(len(SCORES))],
                                         batch.batch["turn_ids"], columns, "retrieval")
    rewards = [turn_rewards(pages[r], scores[r], TRUTHS[r // N], PRESETS["retrieval"]).total for r in range(len(scores))]
    assert check_credit(batch, TRUTHS, scores, rewards, advantages, estimator, N, "retrieval") == []
    assert metrics["reward/turn/1/mean"] > 0  # the retrieval part reached the first turns
    # without the columns, turns are the mask's runs and the rewards the tensor's: today's reward
    alone, _ = trainer_credit("turn", token_rewards, mask, [r // N for r in range(len(SCORES))])
    off = [[0.0] * (len(p) - 1) + [s["overall"]] for p, s in zip(pages, scores)]
    got = turn_rewards_from_tokens(token_rewards, batch.batch["turn_ids"])
    assert [len(r) for r in got] == [len(r) for r in off]
    assert [x for r in got for x in r] == pytest.approx([x for r in off for x in r])  # float32 on the tensor
    assert check_credit(batch, TRUTHS, scores, off, alone, "turn", N) == []
