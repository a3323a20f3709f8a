"""Turn-level estimators (`training/estimators.py`): each worked out by hand on a small batch,
GRPO against verl's own function, and unbiasedness by simulation (a fixed policy in a toy
retrieval task whose actions are all worth the same: every estimator's expected advantage is 0 at
every turn, after every action; a per-turn-index normalisation whose baseline runs to the
sample's own last turn is not, and the test tells it apart)."""

from __future__ import annotations

import random
from collections import defaultdict

import numpy as np
import pytest
import torch

from vrag_rollout.training.estimators import (
    page_states,
    reward_to_go,
    token_advantages,
    turn_metrics,
    turn_rewards_from_tokens,
    turn_values,
    turns_from_mask,
)

# two groups: rows 0-2 (one question), rows 3-4 (another)
REWARDS = [[0.1, 0.5], [0.0, 0.0, 1.0], [0.3], [0.2, 0.2], [0.0]]
INDEX = [0, 0, 0, 1, 1]
STATES = [["", "a"], ["", "a", "ab"], [""], ["", "c"], [""]]


def test_turn_reward_to_go_with_leave_one_out_baseline_by_hand():
    # G: row0 [0.6, 0.5], row1 [1, 1, 1], row2 [0.3]; row3 [0.4, 0.2], row4 [0.0]
    # b_t(i) = mean over the others of G at min(t, their last turn)
    want = [[0.6 - (1.0 + 0.3) / 2, 0.5 - (1.0 + 0.3) / 2],
            [1.0 - (0.6 + 0.3) / 2, 1.0 - (0.5 + 0.3) / 2, 1.0 - (0.5 + 0.3) / 2],
            [0.3 - (0.6 + 1.0) / 2],
            [0.4 - 0.0, 0.2 - 0.0],
            [0.0 - 0.4]]
    got = turn_values("turn", REWARDS, INDEX)
    for row, values in zip(got, want):
        assert values == pytest.approx(row)


def test_gigpo_episode_and_step_groups_by_hand():
    mean0 = (0.6 + 1.0 + 0.3) / 3
    start0 = (0.6 + 1.0 + 0.3) / 3  # state "" of group 0: every row's first turn
    a = (0.5 + 1.0) / 2             # state "a": row 0's turn 2 and row 1's turn 2
    want = [[(0.6 - mean0) + (0.6 - start0), (0.6 - mean0) + (0.5 - a)],
            [(1.0 - mean0) + (1.0 - start0), (1.0 - mean0) + (1.0 - a), (1.0 - mean0) + 0.0],  # "ab": alone
            [(0.3 - mean0) + (0.3 - start0)],
            [(0.4 - 0.2) + (0.4 - 0.2), (0.4 - 0.2) + 0.0],
            [(0.0 - 0.2) + (0.0 - 0.2)]]
    got = turn_values("gigpo", REWARDS, INDEX, STATES)
    for row, values in zip(got, want):
        assert values == pytest.approx(row)
    # states are per episode group: the same key in another group is another step group
    assert turn_values("gigpo", REWARDS, INDEX, [["s"] * len(r) for r in REWARDS])[4] == pytest.approx([-0.2 - 0.2])


def test_grpo_values_are_verls_group_normalised_returns():
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    got = turn_values("grpo", REWARDS, INDEX)
    scores = torch.zeros(5, 3)
    for row, r in enumerate(REWARDS):
        scores[row, 0] = sum(r)
    theirs, _ = compute_grpo_outcome_advantage(scores, torch.ones(5, 3), np.array(INDEX), norm_adv_by_std_in_grpo=True)
    for row, values in enumerate(got):
        assert values == pytest.approx([float(theirs[row, 0])] * len(REWARDS[row]), abs=1e-6)


def test_page_states_are_the_pages_shown_before_each_turn():
    assert page_states([["d_1"], [], ["d_2", "d_1"]]) == [frozenset(), {"d_1"}, {"d_1"}]


def test_token_advantages_only_on_sampled_tokens_of_their_turn():
    # row: turn 1 sampled (3), its observation (2), turn 2 sampled (2), padding (1)
    turn_ids = torch.tensor([[1, 1, 1, 1, 1, 2, 2, 0]])
    mask = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 0]])
    got = token_advantages([[0.25, -0.5]], turn_ids, mask)
    assert torch.equal(got, torch.tensor([[0.25, 0.25, 0.25, 0, 0, -0.5, -0.5, 0]]))
    with pytest.raises(ValueError):
        token_advantages([[0.25]], turn_ids, mask)  # a sampled turn without a value


def test_turns_from_mask_and_rewards_per_turn():
    mask = torch.tensor([[1, 1, 0, 0, 1, 0, 1, 1, 0], [0, 1, 1, 0, 0, 0, 0, 0, 0]])
    turns = turns_from_mask(mask)
    assert turns.tolist() == [[1, 1, 1, 1, 2, 2, 3, 3, 3], [0, 1, 1, 1, 1, 1, 1, 1, 1]]
    rewards = torch.zeros(2, 9)
    rewards[0, 3], rewards[0, 7], rewards[1, 2] = 0.5, 1.0, 0.25  # turn 1's on its observation
    assert turn_rewards_from_tokens(rewards, turns) == [[0.5, 0.0, 1.0], [0.25]]


def test_metrics_per_turn():
    metrics = turn_metrics([[0.0, 1.0], [0.5]], [[0.1, 0.2], [0.3]])
    assert metrics["reward/turn/1/mean"] == 0.25 and metrics["reward/turn/2/mean"] == 1.0
    assert metrics["advantage/turn/1/mean"] == pytest.approx(0.2) and metrics["advantage/turn/2/std"] == 0.0


def test_unknown_estimator_and_missing_states_are_refused():
    with pytest.raises(ValueError):
        turn_values("ppo", REWARDS, INDEX)
    with pytest.raises(ValueError):
        turn_values("gigpo", REWARDS, INDEX)


# --- unbiasedness by simulation --------------------------------------------------------------
MAX_TURNS = 4
ACTIONS = ("search_a", "search_b", "answer")
POLICY = (0.35, 0.35, 0.3)  # fixed; the last turn must answer


def toy_episode(rng: random.Random):
    """(turn rewards, actions, state keys): a search earns +-0.3 (mean 0), an answer 1 w.p. 0.6,
    so every action at every turn is worth 0.6 from there on: the true advantage is 0."""
    rewards, actions, states, searched = [], [], [], set()
    for turn in range(MAX_TURNS):
        action = "answer" if turn == MAX_TURNS - 1 else rng.choices(ACTIONS, POLICY)[0]
        states.append(frozenset(searched))
        actions.append(action)
        if action == "answer":
            rewards.append(float(rng.random() < 0.6))
            break
        rewards.append(0.3 if rng.random() < 0.5 else -0.3)
        searched.add(action)
    return rewards, actions, states


def per_turn_index_normalised(rewards, index):
    """The biased reference (verl#7244): each turn index's rewards centred on that index's mean over
    the group's samples that reached it, summed from turn t to the sample's own last turn."""
    means = defaultdict(list)
    for r, g in zip(rewards, index):
        for t, x in enumerate(r):
            means[(g, t)].append(x)
    centred = [[x - np.mean(means[(g, t)]) for t, x in enumerate(r)] for r, g in zip(rewards, index)]
    return [reward_to_go(row) for row in centred]


def conditional_means(values, actions):
    cells = defaultdict(list)
    for row_values, row_actions in zip(values, actions):
        for t, (value, action) in enumerate(zip(row_values, row_actions)):
            cells[(t, action)].append(value)
    return {cell: (float(np.mean(v)), float(np.std(v) / np.sqrt(len(v)))) for cell, v in cells.items() if len(v) > 500}


@pytest.fixture(scope="module")
def simulated():
    rng = random.Random(7)
    n, groups = 4, 12000
    episodes = [toy_episode(rng) for _ in range(n * groups)]
    rewards, actions, states = (list(x) for x in zip(*episodes))
    return rewards, actions, states, [row // n for row in range(n * groups)]


@pytest.mark.parametrize("name", ["grpo", "turn", "gigpo"])
def test_expected_advantage_is_zero_at_every_turn_after_every_action(simulated, name):
    rewards, actions, states, index = simulated
    values = turn_values(name, rewards, index, states)
    means = conditional_means(values, actions)
    assert len(means) >= 8  # turns 1-3 with all three actions, turn 4's answer
    for cell, (mean, error) in means.items():
        assert abs(mean) < max(0.02, 5 * error), (name, cell, mean, error)


def test_the_simulation_catches_a_per_turn_index_baseline(simulated):
    rewards, actions, _, index = simulated
    means = conditional_means(per_turn_index_normalised(rewards, index), actions)
    worst = max(abs(mean) for mean, _ in means.values())
    assert worst > 0.1, means  # continuing pays the later turns' means: an action-dependent baseline
