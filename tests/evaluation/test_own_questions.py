"""Your own questions (converted without `--from`) as the `questions` benchmark: the project's rules
(normalized exact match and token F1 of `core.reward`; a reference "Not answerable" marks an
unanswerable question), worked by hand; read from a converted file; scored into records and a
report that names its rules and leaves questions without gold pages out of the retrieval means.

Expected numbers are worked out by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import json

import pytest

from vrag_rollout.data import dataset
from vrag_rollout.devkit.evaluate_job import in_scope, question_record, read_benchmark
from vrag_rollout.devkit.job_checks import JobInputError
from vrag_rollout.evaluation.protocol import Protocol
from vrag_rollout.evaluation.report import build_report, markdown
from vrag_rollout.evaluation.scorers import scorer_for
from vrag_rollout.evaluation.scorers.questions import NAME, answerable

SCORER = scorer_for("questions")


# ---- the rules, by hand

@pytest.mark.parametrize("prediction, reference, accuracy, f1", [
    ("The North Car Park.", "north car park", 1.0, 1.0),  # case, punctuation and the article dropped
    ("car park", "the north car park", 0.0, 0.8),  # P = 2/2, R = 2/3: F1 = 2 * 1 * 2/3 / (5/3) = 0.8
    ("Heliotrope Inc", "Heliotrope", 0.0, 2 / 3),  # P = 1/2, R = 1: F1 = 2 * 1/2 / (3/2) = 2/3
    ("north", "eleven percent", 0.0, 0.0),  # no word in common
    ("not answerable.", "Not answerable", 1.0, 1.0),  # the right answer to an unanswerable question
    ("11%", "eleven percent", 0.0, 0.0),  # no number words: the rules are plain string rules
])
def test_accuracy_is_normalized_exact_match_and_f1_token_f1(prediction, reference, accuracy, f1):
    row = SCORER.score(prediction, reference)
    assert row == {"accuracy": accuracy, "f1": pytest.approx(f1), "answered": 1.0}


def test_no_answer_scores_zero_and_the_aggregate_is_the_means():
    rows = [SCORER.score("north car park", "the north car park"), SCORER.score("car park", "the north car park"),
            SCORER.score(None, "Heliotrope")]
    assert rows[2] == {"accuracy": 0.0, "f1": 0.0, "answered": 0.0}
    # accuracy (1 + 0 + 0) / 3; f1 (1 + 0.8 + 0) / 3 = 0.6
    assert SCORER.aggregate(rows) == {"accuracy": pytest.approx(1 / 3), "f1": pytest.approx(0.6), "count": 3.0,
                                      "unanswered": 1.0}


@pytest.mark.parametrize("reference, expected", [
    ("Not answerable", False), ("not answerable.", False), ("  NOT  ANSWERABLE ", False),  # MMLongBench-Doc's words
    ("Not applicable", True), ("The report does not say; not answerable", True), ("", True),
])
def test_a_reference_that_says_not_answerable_marks_an_unanswerable_question(reference, expected):
    assert answerable(reference) is expected


def test_the_rules_are_named_as_the_projects():
    assert NAME == "questions" and "project's" in SCORER.rules and "not a published set's" in SCORER.rules
    assert "exact match" in SCORER.rules and "token F1" in SCORER.rules and "Not answerable" in SCORER.rules


# ---- a converted file of your own questions

QUESTIONS = [  # a gold page, an open-domain question (no document) and an unanswerable one
    {"uid": "emissions", "query": "By how much did emissions fall in 2025?", "reference_answer": "eleven percent",
     "meta_info": {"file_name": "annual_report.pdf", "reference_page": [4]}},
    {"uid": "maker", "query": "Which company makes the HX-300?", "reference_answer": "Heliotrope"},
    {"uid": "headcount", "query": "How many employees were there in 2019?", "reference_answer": "Not answerable",
     "meta_info": {"file_name": "annual_report.pdf", "reference_page": []}},
]
ANSWERS = {"emissions": ("Eleven percent.", [["annual_report_2", "annual_report_4"]]),  # right; its gold page shown
           "maker": ("Northwind", [["product_guide_1"]]),  # wrong; no gold page to find
           "headcount": ("Not answerable", [["annual_report_3"]])}  # right


def converted(tmp_path, scope="corpus"):
    source = tmp_path / "my_questions.json"
    source.write_text(json.dumps(QUESTIONS))
    out = tmp_path / f"my_questions-{scope}.parquet"
    dataset.convert_dataset(source, out, scope=scope)  # no --from: no eval column
    return out


def records(data, protocol):
    samples, truths, infos = read_benchmark(data)
    out = []
    for (qid, (answer, pages)), sample, truth, info in zip(ANSWERS.items(), samples, truths, infos):
        text = "".join(f"<search>q</search><result>{' '.join(turn)}</result>" for turn in pages)
        row = {"turn_page_ids": pages, "termination_reason": "answered", "num_searches": len(pages),
               "episode": {"batch": "episodes/batch-0001.html", "row": 0}}
        out.append(question_record(qid, info, sample, truth, f"{text}<answer>{answer}</answer>", row, protocol, None))
    return out


def test_a_file_without_an_eval_column_reads_as_the_questions_benchmark(tmp_path):
    _samples, _truths, infos = read_benchmark(converted(tmp_path))
    assert [info["set"] for info in infos] == [NAME] * 3
    assert [info["answerable"] for info in infos] == [True, True, False]  # "Not answerable": unanswerable
    assert [info["answer_format"] for info in infos] == [None] * 3 and all(not i["categories"] for i in infos)


def test_records_and_report_score_by_the_projects_rules(tmp_path):
    found = records(converted(tmp_path), Protocol())
    assert [r["metrics"]["accuracy"] for r in found] == [1.0, 0.0, 1.0]
    assert [r["set"] for r in found] == [NAME] * 3 and all(r["counted"] for r in found)
    # retrieval: the gold page was shown (recall 1); no gold page: no retrieval metrics, not 0
    assert found[0]["retrieval"]["recall"] == 1.0 and found[1]["retrieval"] is None and found[2]["retrieval"] is None
    report = build_report(found, {"protocol": Protocol().to_dict(), "sets": [NAME]})
    bench = report["benchmarks"][NAME]
    # accuracy (1 + 0 + 1) / 3; the retrieval means over the one question with a gold page
    assert bench["scores"]["accuracy"] == pytest.approx(2 / 3) and bench["counted"] == 3
    assert bench["retrieval"] == {"questions": 1, "recall": 1.0, "ndcg": pytest.approx(1 / 1.5849625007211563)}
    assert bench["scoring"] == SCORER.rules
    text = markdown(report)
    assert "## questions" in text and f"Scored by {SCORER.rules}" in text
    assert "2 counted questions without a gold page are left out of page recall and page ndcg" in text
    assert "`sets`: questions (your own questions, scored by the project's rules)" in text


def test_unanswerable_exclude_leaves_the_not_answerable_question_out(tmp_path):
    found = records(converted(tmp_path), Protocol(unanswerable="exclude"))
    assert [r["excluded"] for r in found] == [None, None, "unanswerable"]
    bench = build_report(found, {"protocol": Protocol(unanswerable="exclude").to_dict()})["benchmarks"][NAME]
    # accuracy over emissions and maker: (1 + 0) / 2
    assert (bench["counted"], bench["excluded_unanswerable"]) == (2, 1)
    assert bench["scores"]["accuracy"] == pytest.approx(0.5)


def test_document_scope_of_an_open_domain_question_says_what_to_do(tmp_path):
    samples, _truths, infos = read_benchmark(converted(tmp_path))
    assert in_scope(samples[0], infos[0], "corpus", "tags", False).doc_id is None
    with pytest.raises(JobInputError, match="your own questions.*--scope corpus") as refused:
        in_scope(samples[1], infos[1], "document", "tags", False)
    assert "--from" not in str(refused.value)  # a set's advice does not fit your own questions


def test_each_set_names_the_rules_that_score_it():
    from vrag_rollout.evaluation.scorers import SCORERS

    for name, scorer in SCORERS.items():
        assert scorer.rules, name
    assert "published" in scorer_for("mmlongbench-doc").rules and "project's" in scorer_for("mmdocir").rules

