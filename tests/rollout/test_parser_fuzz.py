"""Every parser of model-sampled text survives hostile input (issue 32, defect 4).

A policy's output is hostile input: whatever it writes, a parser answers an action, an invalid
action with a short message for the policy (an error observation), or a score of 0, never an
exception, which would abort the whole `generate_sequences` (or the reward of a whole batch).
Fuzzed with hypothesis, derandomized (CI sees the same examples every run):

- arbitrary text, and text assembled from the grammar's own pieces (tags, digits, brackets);
- arbitrary JSON inside `<tool_call>` blocks: huge integers, NaN and infinities, nested lists,
  strings where numbers go, wrong types for every argument, unicode; and raw JSON text with
  what `json.dumps` cannot write (integers of thousands of digits, nesting deeper than the
  recursion limit);
- near-valid actions: the right tags and tools with hostile contents (lone surrogates too, which
  `json.loads` makes of a `\\udXXX` escape: not text, UTF-8 cannot encode them).

The parsers: `core.actions.parse_action`, `core.tool_turns` (`parse_tool_calls`,
`has_open_call`, `final_answer`), `core.regions` (`parse_region`, `to_fractions`, `resolve`:
`RegionError` is their documented refusal), `core.reward` (`format_score`, `last_answer`,
`score_response`, `compute_scores`, and verl's `compute_score` over it), `core.step` (both
per-turn steps, with the real tokenizer building the error observations), verl's
`turn_output`, which reads the decoded text of a turn, and the viewer's readers
(`verify.episode_facts`).
The numbers are read by `core.readers`, the one tolerant reader every parser shares.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vrag_rollout.core.actions import (MAX_QUERY_CHARS, Answer, Crop, Fetch, Invalid, Search, Stop,
                                       parse_action)
from vrag_rollout.core.readers import MAX_PAGE
from vrag_rollout.core.regions import (ABSOLUTE, RELATIVE_1000, Region, RegionError, RegionRequest,
                                       parse_region, resolve, to_fractions)
from vrag_rollout.core.reward import compute_scores, format_score, last_answer, score_response
from vrag_rollout.core.tool_turns import final_answer, has_open_call, parse_tool_calls

pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")  # examples of 100k characters
FUZZ = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MAX_MESSAGE = 400  # an error observation is a short sentence, never an echo of the hostile text

# ---- strategies ----
HUGE_INTS = st.sampled_from([10**309, -(10**309), 2**1024, 10**4000, -(10**4000)]) | st.integers(
    min_value=-(10**400), max_value=10**400)
JSON_SCALARS = (st.none() | st.booleans() | st.integers() | HUGE_INTS
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=5), max_leaves=12)
# Numbers as text, including what json.dumps never writes and int() or float() refuse.
NUMBER_TEXTS = st.one_of(
    st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n),
    st.integers(min_value=1, max_value=6000).map(lambda n: "-" + "1" * n),
    st.sampled_from(["0", "1", "2", "3", "80", "1000", "1e999", "-1e999", "1e-999", "NaN", "Infinity", "-Infinity",
                     "nan", "inf", "-inf", "1e309", "0x10", "1_000", "\uff11\uff12", "\u0663", "+5", "5.", ".5", "",
                     " ", "true", "null", '"7"', "[1]", "1e400" + "0" * 10]),
    st.integers().map(str), st.floats().map(repr),
)
SURROGATES = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"]), min_size=1,
                     max_size=3)
TOOL_NAMES = st.sampled_from(["search", "fetch", "crop"]) | SURROGATES | JSON_VALUES
ARGUMENTS = st.fixed_dictionaries({}, optional={
    "query": st.text(max_size=30) | SURROGATES | JSON_VALUES,  # json.dumps escapes a lone surrogate
    "page": st.integers(min_value=-3, max_value=12) | HUGE_INTS | JSON_VALUES,
    "mode": st.sampled_from(["image", "text"]) | JSON_VALUES,
    "bbox": st.lists(st.integers(min_value=-5, max_value=1200) | HUGE_INTS | JSON_SCALARS, max_size=6) | JSON_VALUES,
})
CALLS = st.fixed_dictionaries({"name": TOOL_NAMES, "arguments": ARGUMENTS | JSON_VALUES}) | JSON_VALUES


def _dumps(value) -> str:
    try:
        return json.dumps(value)
    except ValueError:  # an int past str()'s 4300 digits: the raw-text strategies write those
        return "0"


@st.composite
def raw_crop_calls(draw) -> str:
    """A crop call written as text, so its numbers may be anything a policy types."""
    numbers = [draw(NUMBER_TEXTS) for _ in range(draw(st.integers(min_value=0, max_value=5)))]
    page = draw(st.none() | NUMBER_TEXTS)
    arguments = ('"page": ' + page + ", " if page is not None else "") + '"bbox": [' + ", ".join(numbers) + "]"
    return '{"name": "crop", "arguments": {' + arguments + "}}"


NESTED = st.integers(min_value=1, max_value=5000).map(lambda depth: "[" * depth + "]" * depth)
SHALLOW_BODIES = CALLS.map(_dumps) | raw_crop_calls() | st.text(max_size=60)
CALL_BODIES = SHALLOW_BODIES | NESTED


@st.composite
def tool_call_turns(draw, bodies=CALL_BODIES) -> str:
    """An assistant turn of the native format: a thought, calls with hostile bodies, maybe a
    block left open or text after the calls, the end-of-turn token."""
    bodies = draw(st.lists(bodies, max_size=3))
    text = draw(st.sampled_from(["", "<think>plan</think>\n"])) + "\n".join(
        f"<tool_call>\n{body}\n</tool_call>" for body in bodies)
    text += draw(st.sampled_from(["", " trailing", "\n<tool_call>\n{", "<answer>a</answer>"]))
    return text + draw(st.sampled_from(["<|im_end|>", ""]))


PIECES = st.sampled_from(["<search>", "</search>", "<fetch>", "</fetch>", "<crop>", "</crop>", "<bbox>", "</bbox>",
                          "<answer>", "</answer>", "<think>", "</think>", "<result>", "</result>", "<tool_call>",
                          "</tool_call>", "<tool_response>", "</tool_response>", "<|im_end|>", "image, ", "text,",
                          "[", "]", ", ", "-", "{", "}", '"', ":", "\n", "3-th"])
TEXT = st.text() | st.lists(PIECES | NUMBER_TEXTS | st.text(max_size=4), max_size=12).map("".join)
TAGS = st.sampled_from(["search", "fetch", "crop", "bbox", "answer"])


@st.composite
def tag_bodies(draw) -> str:
    """The body of a tags-format action, near the grammar: modality and page, page and box, box."""
    number = NUMBER_TEXTS
    box = "[" + ", ".join(draw(number) for _ in range(draw(st.integers(min_value=0, max_value=5)))) + "]"
    return draw(st.sampled_from(["{mod}, {n}", "{n}, {box}", "{box}", "{n}-th", "{text}"])).format(
        mod=draw(st.sampled_from(["image", "text", "IMAGE", "video", ""])), n=draw(number), box=box,
        text=draw(st.text(max_size=30)))


@st.composite
def tag_turns(draw) -> tuple[str, str]:
    """(text, the stop string the engine reports) of a tags-format turn ending in an action."""
    tag = draw(TAGS)
    text = draw(st.sampled_from(["", "<think>look</think>", "<answer>x</answer>"])) + f"<{tag}>{draw(tag_bodies())}</{tag}>"
    return text + draw(st.sampled_from(["", "tail"])), f"</{tag}>"


ACTIONS = (Search, Fetch, Crop, Answer, Stop, Invalid)


def assert_usable(action) -> None:
    """An action of the documented types, with values the rollout can execute as they are."""
    assert isinstance(action, ACTIONS), action
    if isinstance(action, Search):
        assert isinstance(action.query, str) and 0 < len(action.query) <= MAX_QUERY_CHARS
        action.query.encode("utf-8")  # what goes to the retriever is text it can encode
    if isinstance(action, Fetch):
        assert action.modality in ("image", "text") and type(action.page) is int and 1 <= action.page <= MAX_PAGE
    if isinstance(action, Crop):
        assert action.page is None or (type(action.page) is int and 1 <= action.page <= MAX_PAGE)
        assert len(action.box) == 4 and all(type(v) is float and math.isfinite(v) for v in action.box)
    if isinstance(action, Invalid):
        assert isinstance(action.message, str) and 0 < len(action.message) <= MAX_MESSAGE, action
        action.message.encode("utf-8")  # the tokenizer encodes it into the error observation
        assert isinstance(action.kind, str) and action.kind


# ---- the defect itself ----
HUGE_CROP = '<tool_call>\n{"name": "crop", "arguments": {"page": 1, "bbox": [0, 0, 1' + "0" * 309 + ', 500]}}\n</tool_call>'


def test_a_huge_integer_in_a_crop_box_is_an_invalid_action_not_an_overflow():
    """10**309 is past the float range: the call is refused as a bad region, and the reward
    (which reads crop calls even when the region action is off) scores the format 0."""
    (call,) = parse_tool_calls(HUGE_CROP + "<|im_end|>", regions=True)
    assert isinstance(call, Invalid) and call.kind == "bad_region", call
    assert format_score(HUGE_CROP + "<answer>a</answer>") == 0.0
    assert score_response(HUGE_CROP + "<answer>a</answer>", "a")["accuracy"] == 1.0


@pytest.mark.parametrize("text, stop", [
    ("<fetch>image, " + "9" * 5000 + "</fetch>", "</fetch>"),  # int() refuses more than 4300 digits
    ("<crop>" + "9" * 5000 + ", [0, 0, 500, 500]</crop>", "</crop>"),
    ("<crop>2, [0, 0, 1e999, 500]</crop>", "</crop>"),  # inf
])
def test_huge_numbers_in_tags_are_invalid_actions(text, stop):
    action = parse_action(text, "stop", stop, regions=True)
    assert isinstance(action, Invalid) and action.kind in ("bad_page", "bad_region"), action
    assert format_score(text + "<result>r</result><answer>a</answer>") == 0.0


@pytest.mark.parametrize("body", [
    "[" * 100000 + "]" * 100000,  # past the recursion limit of the JSON parser
    '{"name": "fetch", "arguments": {"page": ' + "9" * 5000 + ', "mode": "image"}}',  # past int()'s digit limit
    '{"name": ' + "[" * 900 + "]" * 900 + ', "arguments": {}}',  # a name not to echo whole (1800 chars)
])
def test_json_the_rollout_cannot_use_is_a_short_invalid_action(body):
    (call,) = parse_tool_calls(f"<tool_call>\n{body}\n</tool_call>", regions=True)
    assert_usable(call)
    assert isinstance(call, Invalid), call


# ---- the fuzz ----
@FUZZ
@given(text=TEXT | tag_turns().map(lambda turn: turn[0]),
       finish=st.sampled_from(["stop", "length", "abort", "weird"]),
       stop=st.none() | st.integers() | st.sampled_from(["</search>", "</fetch>", "</crop>", "</bbox>", "x"]),
       regions=st.booleans())
def test_parse_action_on_arbitrary_text(text, finish, stop, regions):
    assert_usable(parse_action(text, finish, stop, regions=regions))


@FUZZ
@given(turn=tag_turns(), modes=st.sampled_from([("image", "text"), ("image",), ("text",)]))
@example(turn=("<fetch>image, " + "9" * 5000 + "</fetch>", "</fetch>"), modes=("image", "text"))
@example(turn=("<crop>" + "9" * 5000 + ", [1, 2, 3, 4]</crop>", "</crop>"), modes=("image", "text"))
def test_parse_action_on_near_valid_tags(turn, modes):
    text, stop = turn
    assert_usable(parse_action(text, "stop", stop, modes, regions=True))


@FUZZ
@given(text=tool_call_turns() | TEXT, regions=st.booleans())
@example(text=HUGE_CROP, regions=True)
@example(text="<tool_call>" + "[" * 100000 + "</tool_call>", regions=False)
def test_tool_call_parsers_on_hostile_turns(text, regions):
    calls = parse_tool_calls(text, regions)
    assert isinstance(calls, list)
    for call in calls:
        assert_usable(call)
        assert not isinstance(call, (Answer, Stop))
        assert regions or not isinstance(call, Crop)
    assert isinstance(has_open_call(text), bool)
    assert isinstance(final_answer(text), str)


@FUZZ
@given(body=tag_bodies() | TEXT)
@example(body="9" * 5000 + ", [1, 2, 3, 4]")
@example(body="[1e999, 0, 10, 10]")
def test_parse_region_reads_or_refuses(body):
    try:
        page, box = parse_region(body)
    except RegionError as error:
        assert 0 < len(str(error)) <= MAX_MESSAGE
        return
    assert page is None or (type(page) is int and 1 <= page <= MAX_PAGE)
    assert len(box) == 4 and all(type(v) is float and math.isfinite(v) for v in box)


@FUZZ
@given(box=st.lists(st.integers(min_value=-5, max_value=1200) | HUGE_INTS | JSON_SCALARS, max_size=6) | JSON_VALUES,
       frame=st.sampled_from([RELATIVE_1000, ABSOLUTE]),
       page=st.none() | st.integers(min_value=-2, max_value=4) | HUGE_INTS | JSON_VALUES)
@example(box=[0, 0, 10**309, 500], frame=RELATIVE_1000, page=2)
@example(box=[0, 0, 500, 500], frame=RELATIVE_1000, page=10**4000)
def test_region_geometry_reads_or_refuses(box, frame, page):
    """`to_fractions` and `resolve` on any box and page: a region inside the page, or
    `RegionError` (their documented refusal) with a short reason."""
    class Shown:
        image = type("Image", (), {"size": (448, 560)})()

    for call in (lambda: to_fractions(box, frame, (448, 560)),
                 lambda: resolve(page, box, frame, "doc", {"doc_2": Shown()}, "doc_2")):
        try:
            result = call()
        except RegionError as error:
            assert 0 < len(str(error)) <= MAX_MESSAGE
            continue
        region = result.region if isinstance(result, RegionRequest) else result
        assert isinstance(region, Region)
        assert all(0.0 <= v <= 1.0 for v in (region.x1, region.y1, region.x2, region.y2))


@FUZZ
@given(text=TEXT | tool_call_turns() | tag_turns().map(lambda turn: turn[0] + "<result>r</result><answer>a</answer>"))
@example(text=HUGE_CROP + "<answer>a</answer>")
@example(text="<fetch>image, " + "9" * 5000 + "</fetch><answer>a</answer>")
@example(text="<crop>" + "9" * 5000 + ", [0, 0, 9, 9]</crop><answer>a</answer>")
@example(text="<tool_call>" + "[" * 100000 + "</tool_call><answer>a</answer>")
def test_the_reward_scores_any_response(text):
    assert format_score(text) in (0.0, 1.0)
    answer = last_answer(text)
    assert answer is None or isinstance(answer, str)
    truth = {"answer": "a", "doc_id": "doc", "gold_pages": [2], "page_ids": [["doc_2"]]}
    (scores,) = compute_scores([{"response": text, "response_length": len(text), "ground_truth": json.dumps(truth)}])
    assert scores == score_response(text, truth)
    assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in scores.values()), scores


@FUZZ
@given(text=TEXT | tool_call_turns())
@example(text=HUGE_CROP + "<answer>a</answer>")
def test_verls_reward_glue_scores_any_response(text):
    from vrag_rollout.integrations.verl.reward import compute_score

    score = compute_score("vrag", text, '{"answer": "a"}', {"page_ids": []})
    assert 0.0 <= score["score"] <= 1.0


@FUZZ
@given(text=TEXT, stops=st.lists(st.sampled_from(["</search>", "</fetch>", "</crop>", "</bbox>", "</tool_call>"]),
                                 max_size=4),
       reason=st.none() | st.sampled_from(["completed", "aborted"]), ids=st.lists(st.integers(0, 9), max_size=6))
def test_verls_turn_reading_on_any_decoded_text(text, stops, reason, ids):
    from vrag_rollout.integrations.verl.turns import turn_output

    out = turn_output(ids, None, stop_reason=reason, max_tokens=4, stop_strings=stops, eos_ids=(9,),
                      decode=lambda _: text)
    assert out.finish_reason in ("stop", "length", "abort") and isinstance(out.text, str)


# ---- the step: the rollout's own path, error observations built by the real tokenizer ----
@pytest.fixture(scope="module")
def observations(tiny_processor):
    from vrag_rollout.core.observation import ObservationBuilder, VisionTokens

    tokenizer = tiny_processor.tokenizer
    return ObservationBuilder(tokenizer, VisionTokens.from_tokenizer(tokenizer))


def _episode(length: int = 4096):
    from vrag_rollout.core.episode import Episode

    return Episode(index=0, prompt_engine_ids=[1, 2], prompt_images=[], doc_id="doc", response_length=length,
                   max_images=4)


@FUZZ
@given(text=TEXT | tag_turns().map(lambda turn: turn[0]),
       stop=st.none() | st.sampled_from(["</search>", "</fetch>", "</crop>", "</bbox>"]),
       finish=st.sampled_from(["stop", "length", "abort"]), regions=st.booleans(), last_turn=st.booleans())
@example(text="<fetch>image, " + "9" * 5000 + "</fetch>", stop="</fetch>", finish="stop", regions=False,
         last_turn=False)
def test_the_tags_step_settles_any_turn(observations, text, stop, finish, regions, last_turn):
    from vrag_rollout.core.step import after_generation
    from vrag_rollout.turn_output import TurnOutput

    episode = _episode()
    action = after_generation(episode, TurnOutput(token_ids=(5, 6, 7), text=text, finish_reason=finish,
                                                  stop_reason=stop),
                              last_turn=last_turn, fetch_modes=("image", "text"), observations=observations,
                              regions=regions)
    assert action is None or isinstance(action, (Search, Fetch, Crop))
    if action is not None:
        assert_usable(action)
    assert (action is None) == (episode.done or len(episode.response_ids) > 3)  # ended, corrected or to run


@FUZZ
@given(text=tool_call_turns() | TEXT, regions=st.booleans(), last_turn=st.booleans())
@example(text=HUGE_CROP + "<|im_end|>", regions=True, last_turn=False)
@example(text=HUGE_CROP + "<|im_end|>", regions=False, last_turn=False)
def test_the_tool_call_step_settles_any_turn(observations, text, regions, last_turn):
    from vrag_rollout.core.step import after_tool_call_turn
    from vrag_rollout.core.tool_turns import ToolCalls
    from vrag_rollout.turn_output import TurnOutput

    end = observations.tokenizer.convert_tokens_to_ids("<|im_end|>")
    episode = _episode()
    calls = after_tool_call_turn(episode, TurnOutput(token_ids=(5, 6, end), text=text, finish_reason="stop",
                                                     stop_reason=None),
                                 last_turn=last_turn, turn_end=end, regions=regions)
    assert calls is None or isinstance(calls, ToolCalls)
    for call in calls.calls if calls else ():
        assert_usable(call)
    assert (calls is None) == episode.done


# ---- the viewer (vrag_rollout/verify/, not the rollout's path: a crash there loses a page, not a batch) ----
def test_the_views_action_lines_survive_deep_json():
    from vrag_rollout.verify.episode_facts import last_actions

    assert last_actions("<tool_call>" + "[" * 100000 + "]" * 100000 + "</tool_call>")


@FUZZ
@given(text=TEXT | tool_call_turns(SHALLOW_BODIES))  # deep nesting: the test above
def test_the_views_readers_on_any_text(text):
    from vrag_rollout.verify.episode_facts import last_actions, policy_answer, question

    assert all(isinstance(line, str) for line in last_actions(text))
    assert policy_answer(text) is None or isinstance(policy_answer(text), str)
    assert isinstance(question(text), str)
