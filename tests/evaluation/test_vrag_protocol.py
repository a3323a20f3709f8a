"""ViDoSeek under VRAG-RL's protocol: an answer scores only after a search, and the judge reads
VRAG-RL's criteria and verdict format.

The cases come from VRAG-RL's published code (github.com/Alibaba-NLP/VRAG): `VRAG-RL/verl/utils/
reward_score/vrag.py` (`compute_format_reward_only`: both `<answer>.*</answer>` and
`<search>.*</search>` in the response, user turns removed, else 0) and `VRAG-RL/verl/workers/
reward_manager/rm.py` (`DEFAULT_SYSTEM_TEMPLATE`, filled by `str.replace`; `parse_judge_response`:
the first `<judge>...</judge>`, True when it holds "true" or "True", else False when it holds
"false" or "False", else no verdict; the judge is asked only when the format check passed).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vrag_rollout.devkit.evaluate_job import judge_plan, question_record
from vrag_rollout.evaluation.protocol import Protocol
from vrag_rollout.evaluation.report import build_report, markdown
from vrag_rollout.evaluation.scorers import scorer_for
from vrag_rollout.evaluation.scorers.vidoseek import (JUDGE_PROMPT, JUDGE_PROMPT_VERSION, judge_request,
                                                      read_judge_verdict)
from vrag_rollout.evaluation.search_rule import searched

SEARCHED = "<think>find it</think><search>capital</search><result>page text</result><answer>Berlin</answer>"
UNSEARCHED = "<think>I know it</think><answer>Berlin</answer>"


@pytest.mark.parametrize("response, searches, expected", [
    (SEARCHED, 1, True),
    (UNSEARCHED, 0, False),
    ("<fetch>image, 2</fetch><result>p</result><answer>Berlin</answer>", 0, False),  # a fetch is no search
    ("<result><search>q</search></result><answer>Berlin</answer>", 0, False),  # inside an observation
    ("<think>I could <search> but </search> won't</think><answer>Berlin</answer>", 0, True),  # VRAG's regex
    ('<tool_call>{"name": "search"}</tool_call><tool_response>p</tool_response><answer>B</answer>', 1, True),
])
def test_searched_is_vrag_rls_format_check(response, searches, expected):
    assert searched(response, searches) is expected


def test_the_switch_is_on_for_vidoseek_by_default_and_recorded():
    default = Protocol()
    assert default.requires_search("vidoseek") and not default.requires_search("mmlongbench-doc")
    assert not Protocol(search_required=False).requires_search("vidoseek")
    assert Protocol(search_required=True).requires_search("slidevqa")
    assert default.to_dict()["search_required"] is None and Protocol(search_required=True).to_dict()["search_required"]
    with pytest.raises(ValueError, match="search_required"):
        Protocol(search_required="yes")


def vidoseek_record(text: str, protocol: Protocol, searches: int, judge=None) -> dict:
    sample = SimpleNamespace(question="What is the capital?", doc_id=None)
    info = {"set": "vidoseek", "document": None, "answer_format": None, "categories": {}, "reference": None,
            "answerable": True}
    row = {"turn_page_ids": [], "termination_reason": "answered", "num_searches": searches,
           "episode": {"batch": "episodes/batch-0001.html", "row": 0}}
    truth = {"answer": "Berlin", "doc_id": None, "gold_pages": []}
    return question_record("q1", info, sample, truth, text, row, protocol, judge)


def test_an_answer_without_a_search_scores_zero_under_vrag_rl():
    found = vidoseek_record(UNSEARCHED, Protocol(), searches=0)
    assert found["answer"] == "Berlin" and found["searched"] is False
    assert {key: found["metrics"][key] for key in ("accuracy", "f1", "contains", "unsearched")} == {
        "accuracy": 0.0, "f1": 0.0, "contains": 0.0, "unsearched": 1.0}
    kept = vidoseek_record(UNSEARCHED, Protocol(search_required=False), searches=0)
    assert kept["metrics"]["accuracy"] == 1.0 and "unsearched" not in kept["metrics"]
    searched_record = vidoseek_record(SEARCHED, Protocol(), searches=1)
    assert searched_record["metrics"]["accuracy"] == 1.0 and searched_record["metrics"]["unsearched"] == 0.0
    # the report counts them
    report = build_report([found, searched_record], {"protocol": Protocol().to_dict(), "data": "d", "model": "m"})
    scores = report["benchmarks"]["vidoseek"]["scores"]
    assert scores["accuracy"] == 0.5 and scores["unsearched"] == 1.0
    assert "without a search: 1" in markdown(report)


def test_the_judge_is_not_asked_for_an_answer_without_a_search():
    infos = [{"set": "vidoseek"}, {"set": "vidoseek"}, {"set": "vidoseek"}, {"set": "slidevqa"}]
    texts = [SEARCHED, UNSEARCHED, "<search>q</search> no answer", SEARCHED]
    plan = judge_plan(infos, texts, [1, 0, 1, 1], Protocol())
    assert plan == [True, False, False, None]  # ask / wrong without asking / not a judged set
    assert judge_plan(infos, texts, [1, 0, 1, 1], Protocol(search_required=False)) == [True, True, False, None]
    unjudged = vidoseek_record(UNSEARCHED, Protocol(), 0, judge={"verdict": False, "text": None})
    assert unjudged["metrics"]["judge"] == 0.0


def test_the_judge_prompt_asks_what_vrag_rls_template_asks():
    """VRAG-RL's inputs in its order, its question, its allowance and its reply format (the project
    words the prompt itself: it copies no other project's text)."""
    assert JUDGE_PROMPT_VERSION == "vrag-rl-criteria-1"
    for part in ("## Query\n{query}\n\n## Reference Answer\n{reference_answer}\n\n## Generated Answer\n"
                 "{generated_answer}\n",
                 "<judge>True or False</judge>", "correct", "more information than the reference answer"):
        assert part in JUDGE_PROMPT
    text = judge_request("What is {x}?", "Berlin", "It is {y} Berlin")
    assert "## Query\nWhat is {x}?\n" in text and "## Reference Answer\nBerlin\n" in text
    assert "## Generated Answer\nIt is {y} Berlin\n" in text and "{query}" not in text


@pytest.mark.parametrize("reply, verdict", [
    ("<judge>True</judge>", True), ("<judge>False</judge>", False), ("<judge>true</judge>", True),
    ("The answer matches.\n<judge>True</judge>", True),
    ("<judge>False</judge> ... <judge>True</judge>", False),  # the first block decides
    ("<judge>True or False</judge>", True),  # "True" is looked for first
    ("<judge>not true</judge>", True),  # a substring test, as published
    ("<judge>TRUE</judge>", None), ("<judge>maybe</judge>", None), ("True", None), ("", None), (None, None),
    ("<think>answer with <judge>True</judge></think><judge>False</judge>", False),  # reasoning dropped
])
def test_the_verdict_is_read_as_vrag_rl_reads_it(reply, verdict):
    assert read_judge_verdict(reply) is verdict


def test_rows_without_the_rule_keep_their_shape():
    row = scorer_for("vidoseek").score("Berlin", "Berlin")
    assert "unsearched" not in row and scorer_for("vidoseek").aggregate([row])["accuracy"] == 1.0
