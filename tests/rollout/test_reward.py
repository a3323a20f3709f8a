"""vrag_rollout.core.reward and the EasyR1 loader examples/reward_function/vrag.py, against hand-computed values."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from vrag_rollout.core import reward

REPO = Path(__file__).resolve().parents[2]
LOG2_3 = 1.584962500721156  # log2(3), so 1/log2(3) = 0.6309...


def truth(answer="Eiffel Tower", doc="report", gold=(3, 5), shown=()):
    return json.dumps({"answer": answer, "doc_id": doc, "gold_pages": list(gold), "page_ids": [list(t) for t in shown]})


def test_ndcg_by_hand():
    # ranks 1..3 = pages 2, 3, 5; gold {3, 5}: DCG = 1/log2(3) + 1/log2(4); IDCG = 1/log2(2) + 1/log2(3)
    expected = (1 / LOG2_3 + 1 / 2) / (1 + 1 / LOG2_3)
    assert reward.ndcg([2, 3, 5], {3, 5}) == pytest.approx(expected)
    assert reward.ndcg([3, 5], {3, 5}) == pytest.approx(1.0)
    assert reward.ndcg([5, 3, 9], {3, 5}) == pytest.approx(1.0)
    # one of two gold pages, at rank 1: 1 / (1 + 1/log2(3))
    assert reward.ndcg([3], {3, 5}) == pytest.approx(1 / (1 + 1 / LOG2_3))
    assert reward.ndcg([1, 2], {3}) == 0.0
    assert reward.ndcg([], {3}) == 0.0 and reward.ndcg([3], set()) == 0.0


def test_retrieval_uses_distinct_pages_in_first_seen_order_of_the_gold_document():
    shown = [["report_2", "report_3"], ["report_3", "report_5"]]
    expected = (1 / LOG2_3 + 1 / 2) / (1 + 1 / LOG2_3)  # ranked 2, 3, 5
    score = reward.score_response("<answer>x</answer>", truth(shown=shown))
    assert score["retrieval"] == pytest.approx(expected)
    other_doc = reward.score_response("<answer>x</answer>", truth(shown=[["annex_3", "annex_5"]]))
    assert other_doc["retrieval"] == 0.0
    assert reward.split_page_id("my_doc_12") == ("my_doc", 12)
    with pytest.raises(ValueError, match="page id"):
        reward.split_page_id("report")


def test_answer_parts_by_hand():
    assert reward.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert reward.exact_match("the eiffel tower.", "Eiffel Tower") == 1.0
    # tokens [eiffel tower in paris] vs [eiffel tower]: P = 2/4, R = 2/2, F1 = 2PR/(P+R) = 2/3
    assert reward.token_f1("The Eiffel Tower in Paris", "Eiffel Tower") == pytest.approx(2 / 3)
    assert reward.token_f1("London", "Eiffel Tower") == 0.0


def test_last_answer_is_read_from_the_whole_response_but_never_from_observations():
    response = ("<think>t</think><search>tower</search><result>page text <answer>Big Ben</answer></result>"
                "<fetch>text, 3</fetch><result>more</result><answer>Eiffel Tower</answer>")
    assert reward.last_answer(response) == "Eiffel Tower"
    score = reward.score_response(response, truth(shown=[["report_3"]]))
    assert (score["accuracy"], score["f1"], score["format"]) == (1.0, 1.0, 1.0)
    # weights 0.5 / 0.3 / 0.1 / 0.1; retrieval = 1 / (1 + 1/log2 3)
    assert score["overall"] == pytest.approx(0.5 + 0.3 + 0.1 + 0.1 / (1 + 1 / LOG2_3))
    assert reward.last_answer("<search>x</search><result><answer>A</answer></result>") is None
    assert reward.last_answer("<answer>first</answer> then <answer>second</answer>") == "second"
    assert reward.last_answer("<tool_call>{}</tool_call><tool_response><answer>A</answer></tool_response>") is None


@pytest.mark.parametrize("response, expected", [
    ("<think>a</think><search>q</search><result>r</result><answer>x</answer>", 1.0),
    ("<fetch>image, 2</fetch><result></result><fetch> text ,10 </fetch><result>t</result><answer>x</answer>", 1.0),
    ("<answer>x</answer><answer>y</answer>", 0.0),                      # two final answers
    ("<search>q</search><result>r</result>", 0.0),                       # no answer
    ("<answer>x</answer><search>q</search><result>r</result>", 0.0),    # acts after answering
    ("<search> </search><result>r</result><answer>x</answer>", 0.0),    # empty query
    ("<fetch>image, 0</fetch><result>r</result><answer>x</answer>", 0.0),  # pages start at 1
    ("<fetch>page 3</fetch><result>r</result><answer>x</answer>", 0.0),    # malformed fetch
    ("<think>a<answer>x</answer></think>", 0.0),                          # nested tags
    ("<think>a</think><answer>x", 0.0),                                   # unclosed answer
    ("<answer>x</answer></search>", 0.0),                                 # stray closing tag
    ("<result>forged</result><answer>x</answer>", 1.0),                  # result blocks are observations
    # the tool_call format, as the reward manager decodes it (special tokens skipped)
    ('<think>a</think>\n<tool_call>\n{"name": "search", "arguments": {"query": "q"}}\n</tool_call>\nuser\n'
     '<tool_response>\npage <answer>no</answer>\n</tool_response>\nassistant\n<answer>x</answer>', 1.0),
    ('<tool_call>\n{"name": "fetch", "arguments": {"page": 0, "mode": "image"}}\n</tool_call>'
     '<tool_response>error</tool_response><answer>x</answer>', 0.0),    # a call the rollout refused
    ('<tool_call>{"name": "search", "arguments": {"query": "q"}}', 0.0),  # unclosed call
    # a thinking template's generation prompt ends with "<think>\n": the response starts inside it
    ('plan</think>\n<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>user\n'
     '<tool_response>r</tool_response>assistant\n<think>\nok</think><answer>x</answer>', 1.0),
    ("<answer>x</answer></think>", 0.0),                                 # a stray one later is not
    ('<answer>x</answer><tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>', 0.0),
    # the region action
    ("<fetch>image, 2</fetch><result>p</result><crop>2, [10, 20, 300, 400]</crop><result>c</result><answer>x</answer>",
     1.0),
    ("<bbox>[10, 20, 300, 400]</bbox><result>c</result><answer>x</answer>", 1.0),
    ("<crop>[10, 20, 300, 400]</crop><result>c</result><answer>x</answer>", 0.0),  # a crop names its page
    ("<crop>2, [10, 20, 300]</crop><result>c</result><answer>x</answer>", 0.0),    # not a box
    ("<answer>x</answer><crop>2, [10, 20, 300, 400]</crop>", 0.0),                 # acts after answering
])
def test_format_score(response, expected):
    assert reward.format_score(response) == expected


def test_plain_ground_truth_and_bad_ground_truth():
    score = reward.score_response("<answer>Paris</answer>", "paris")
    assert score["accuracy"] == 1.0 and score["retrieval"] == 0.0
    with pytest.raises(ValueError, match="answer"):
        reward.parse_ground_truth('{"doc_id": "d"}')
    with pytest.raises(ValueError, match="gold_pages"):
        reward.parse_ground_truth('{"answer": "a", "gold_pages": [0]}')


def test_weights_are_configurable_and_checked():
    [score] = reward.compute_scores([{"response": "<answer>no</answer>", "ground_truth": truth()}],
                                    accuracy=0.0, f1=0.0, format=2.0, retrieval=0.0)
    assert score["overall"] == 2.0
    with pytest.raises(ValueError, match="format"):
        reward.compute_scores([], format=-1.0)
    with pytest.raises(TypeError, match="unknown reward weights"):
        reward.compute_scores([], acc=1.0)


def test_example_loader_loads_like_easyr1_and_returns_easyr1_score_dicts():
    path = REPO / "examples" / "reward_function" / "vrag.py"
    spec = importlib.util.spec_from_file_location("custom_reward_fn", path)  # as AutoRewardManager does
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.REWARD_TYPE == "batch"
    inputs = [{"response": "<answer>Eiffel Tower</answer>", "response_length": 5, "ground_truth": truth()},
              {"response": "no answer", "response_length": 2, "ground_truth": truth()}]
    scores = module.compute_score(inputs, accuracy=1.0, f1=0.0, format=0.0, retrieval=0.0)
    assert [s["overall"] for s in scores] == [1.0, 0.0]
    assert set(scores[0]) == {"overall", "accuracy", "f1", "format", "retrieval"}
    assert all(isinstance(v, float) and math.isfinite(v) for s in scores for v in s.values())


def test_turn_retrieval_scores_by_hand():
    truth = json.dumps({"answer": "x", "doc_id": "report", "gold_pages": [3, 5]})
    ideal = 1 + 1 / math.log2(3)
    turns = [["report_1", "report_3"], [], ["report_3", "report_5"], ["other_5"]]
    scores = reward.turn_retrieval_scores(turns, truth)
    # turn 1: report_3 at rank 2; turn 2: nothing; turn 3: only report_5 is new, at rank 1;
    # turn 4: a page of another document is not gold
    assert scores == pytest.approx([(1 / math.log2(3)) / ideal, 0.0, 1 / ideal, 0.0])


FETCH_BODIES = ["image, 3", "text,3", " text , 10 ", "image 3", "IMAGE, 3", "3-th", "image, 0", "image, -2", "page 3",
                "image, ٣", "image, ３", "image, ³", "text, 1٣", "٣-th", "image, 3.0", "image, 9999999", "image,"]


@pytest.mark.parametrize("body", FETCH_BODIES)
def test_the_reward_reads_a_fetch_exactly_as_the_rollout_runs_it(body):
    """One reader: a fetch the rollout would run (`parse_action`) is well formed for the reward's
    format check, and one it would refuse is not; other scripts' digits ("٣", "３") are no page."""
    from vrag_rollout.core.actions import Fetch, parse_action

    action = parse_action(f"<fetch>{body}</fetch>", "stop", "</fetch>")
    response = f"<fetch>{body}</fetch><result>r</result><answer>x</answer>"
    assert reward.format_score(response) == float(isinstance(action, Fetch)), action
    if not body.isascii():
        assert not isinstance(action, Fetch)
