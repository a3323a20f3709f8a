"""The shared per-turn step, without an engine: scripted engine outputs, real tokenizer."""

from __future__ import annotations

import pytest

from vrag_rollout.core.actions import Answer, Search, parse_action
from vrag_rollout.turn_output import TurnOutput
from vrag_rollout.core.episode import Episode
from vrag_rollout.core.observation import Observation, ObservationBuilder, VisionTokens
from vrag_rollout.core.step import after_generation, observe, ready


@pytest.fixture(scope="module")
def builder(tiny_processor):
    tokenizer = tiny_processor.tokenizer
    return ObservationBuilder(tokenizer, VisionTokens.from_tokenizer(tokenizer))


def episode(length=40) -> Episode:
    return Episode(index=0, prompt_engine_ids=[1, 2], prompt_images=[], doc_id="d", response_length=length, max_images=4)


def turn(tokens, text, finish="stop", stop=None) -> TurnOutput:
    return TurnOutput(token_ids=tuple(tokens), text=text, finish_reason=finish, stop_reason=stop)


def test_an_observation_that_fills_the_budget_ends_with_budget_not_length(builder):
    ep = episode(length=10)
    action = after_generation(ep, turn(range(4), "<search>q</search>", stop="</search>"), last_turn=False,
                              fetch_modes=("image", "text"), observations=builder)
    assert action == Search("q")
    observe(ep, Observation(engine_ids=(5,) * 6, trainer_ids=(5,) * 6))
    assert ep.remaining == 0 and ep.termination == "budget"
    assert ep.loss_mask[-1] == 0  # the last token is an observation: the policy never ran out


def test_length_means_the_policys_own_sampling_hit_the_budget(builder):
    ep = episode(length=6)
    after_generation(ep, turn(range(6), "<search>abc", finish="length"), last_turn=False,
                     fetch_modes=("image", "text"), observations=builder)
    assert ep.termination == "length" and ep.loss_mask[-1] == 1
    ep2 = episode(length=6)
    ep2.append_sampled(range(6))
    assert not ready(ep2) and ep2.termination == "length"


def test_an_invalid_call_is_corrected_in_place_and_counted(builder):
    ep = episode(length=60)
    assert after_generation(ep, turn(range(3), "<search></search>", stop="</search>"), last_turn=False,
                            fetch_modes=("image", "text"), observations=builder) is None
    assert ep.invalid_actions == 1 and not ep.done
    text = builder.tokenizer.decode(ep.response_ids[3:])
    assert text == "<result>error: the search query is empty; write <search>your query</search>.</result>"
    assert ep.loss_mask == [1, 1, 1] + [0] * (len(ep.response_ids) - 3)


def test_a_tool_call_on_the_last_turn_ends_with_max_turns(builder):
    ep = episode()
    assert after_generation(ep, turn(range(3), "<search>q</search>", stop="</search>"), last_turn=True,
                            fetch_modes=("image", "text"), observations=builder) is None
    assert ep.termination == "max_turns"


@pytest.mark.parametrize(
    "text, finish, stop, expected",
    [
        ("<answer>paris</answer><search>q</search>", "stop", "</search>", Answer("paris")),  # answer first
        ("<answer>a</answer> then <answer>b</answer> and more", "stop", None, Answer("b")),  # last answer
        ("<search>revenue table", "stop", "</search>", Search("revenue table")),  # stop not in the text
        ("<search>revenue table</sea", "stop", "</search>", Search("revenue table</sea")),
        ("<answer>unfinished", "stop", None, "eos"),
        ("<search>unfinished", "length", None, "length"),
    ],
)
def test_what_a_policy_writes(text, finish, stop, expected):
    action = parse_action(text, finish, stop)
    assert action == expected if not isinstance(expected, str) else action.reason == expected
