"""Per-turn rewards (`core/turn_rewards.py`): today's reward when off, the retrieval part moved to
the turns that earned it (summing to today's), the shaping parts worked out by hand."""

from __future__ import annotations

import math
import random

import pytest

from vrag_rollout.core.reward import (
    GroundTruth,
    parse_ground_truth,
    retrieval_score,
    score_response,
)
from vrag_rollout.core.turn_rewards import (
    PRESETS,
    TurnAction,
    TurnRewardWeights,
    retrieval_shares,
    turn_action,
    turn_rewards,
)

TRUTH = {"answer": "2 4", "doc_id": "doc", "gold_pages": [2, 4]}
SCORE = {"overall": 0.73, "accuracy": 1.0, "f1": 1.0, "format": 1.0, "retrieval": 0.0}


def episode_retrieval(turn_page_ids, truth) -> float:
    """Today's retrieval part of the episode (core.reward), every turn's pages in order."""
    parsed = parse_ground_truth(truth)
    return retrieval_score(GroundTruth(parsed.answer, parsed.doc_id, parsed.gold_pages,
                                       tuple(tuple(t) for t in turn_page_ids)))


def random_episode(rng: random.Random, corpus: bool):
    docs = ["a", "b_x"] if corpus else ["doc"]
    turns = [[f"{rng.choice(docs)}_{rng.randint(1, 5)}" for _ in range(rng.randint(0, 3))] for _ in range(rng.randint(1, 5))]
    if corpus:
        gold = [[rng.choice(docs), rng.randint(1, 5)] for _ in range(rng.randint(0, 3))]
        truth = {"answer": "x", "doc_id": None, "gold_pages": gold}
    else:
        truth = {"answer": "x", "doc_id": rng.choice(["doc", None]), "gold_pages": rng.sample(range(1, 6), rng.randint(0, 3))}
    return turns, truth


def test_off_is_todays_reward_on_the_last_turn_bit_for_bit():
    rng = random.Random(0)
    for _ in range(200):
        turns, truth = random_episode(rng, corpus=rng.random() < 0.5)
        overall = rng.random() * 1.3
        got = turn_rewards(turns, {**SCORE, "overall": overall}, truth, PRESETS["off"])
        assert got.total == [0.0] * (len(turns) - 1) + [overall]  # exact equality
        assert got.total[-1] is not None and got.total[-1] == overall


def test_retrieval_shares_sum_to_todays_retrieval_part():
    rng = random.Random(1)
    for _ in range(300):
        turns, truth = random_episode(rng, corpus=rng.random() < 0.5)
        shares, _ = retrieval_shares(turns, truth)
        assert sum(shares) == pytest.approx(episode_retrieval(turns, truth), abs=1e-12)
        # with the episode's real score, the total stays today's overall
        response = "<fetch>image, 1</fetch><result>x</result><answer>x</answer>"
        score = score_response(response, {**truth, "page_ids": turns})
        got = turn_rewards(turns, score, truth, PRESETS["retrieval"])
        assert sum(got.total) == pytest.approx(score["overall"], abs=1e-12)


def test_shares_by_hand():
    # gold {2, 4}; turn 1 shows page 1 (distractor), turn 2 page 2 (rank 2), turn 3 page 4 (rank 3)
    ideal = 1 + 1 / math.log2(3)
    shares, gold = retrieval_shares([["doc_1"], ["doc_2"], ["doc_4", "doc_2"]], TRUTH)
    assert shares == pytest.approx([0.0, (1 / math.log2(3)) / ideal, 0.5 / ideal])
    assert gold == [0, 1, 1]


def test_shaping_parts_by_hand():
    weights = TurnRewardWeights(retrieval_by_turn=True, new_gold=0.1, repeat_page=0.05, repeat_query=0.02, invalid=0.03)
    turns = [["doc_2", "doc_3"], ["doc_2"], [], ["doc_4"]]
    actions = [TurnAction("search", "q"), TurnAction("search", "q"), TurnAction("invalid"), TurnAction("answer")]
    score = {**SCORE, "retrieval": episode_retrieval(turns, TRUTH)}
    got = turn_rewards(turns, score, TRUTH, weights, turn_actions=actions)
    ideal = 1 + 1 / math.log2(3)
    retrieval = [0.1 * 1 / ideal, 0.0, 0.0, 0.1 * (1 / math.log2(4)) / ideal]
    assert got.parts["retrieval"] == pytest.approx(retrieval)
    assert got.parts["new_gold"] == [0.1, 0.0, 0.0, 0.1]
    assert got.parts["repeat_page"] == [0.0, -0.05, 0.0, 0.0]
    assert got.parts["repeat_query"] == [0.0, -0.02, 0.0, 0.0]
    assert got.parts["invalid"] == [0.0, 0.0, -0.03, 0.0]
    outcome = SCORE["overall"] - 0.1 * score["retrieval"]
    assert got.parts["outcome"] == pytest.approx([0.0, 0.0, 0.0, outcome])
    assert got.total == pytest.approx([0.1 / ideal + 0.1, -0.07, -0.03, retrieval[3] + 0.1 + outcome])


def test_a_turn_reward_belongs_to_the_turn_whose_observation_showed_the_page():
    """Turn 1's pages are `turn_page_ids[0]`: a shift by one turn would pay turn 2."""
    got = turn_rewards([["doc_2"], ["doc_1"]], SCORE, TRUTH, TurnRewardWeights(new_gold=1.0))
    assert got.parts["new_gold"] == [1.0, 0.0]


def test_turn_actions_are_read_from_the_turns_text():
    assert turn_action("<think>x</think><search> Revenue  Table</search>") == TurnAction("search", "revenue table")
    assert turn_action("<search> </search>") == TurnAction("invalid")
    assert turn_action("<fetch>image, 3</fetch>") == TurnAction("fetch")
    assert turn_action("<fetch>image, zero</fetch>") == TurnAction("invalid")
    assert turn_action("<answer>2 4</answer>") == TurnAction("answer")
    assert turn_action("nothing") == TurnAction("none")
    assert turn_action('<tool_call>\n{"name": "search", "arguments": {"query": "A b"}}\n</tool_call>') == TurnAction("search", "a b")


def test_bad_weights_and_presets_are_refused():
    with pytest.raises(ValueError):
        TurnRewardWeights(new_gold=-1)
    with pytest.raises(ValueError):
        from vrag_rollout.core.turn_rewards import preset
        preset("everything")
