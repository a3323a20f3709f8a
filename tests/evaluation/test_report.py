"""The report's tables from hand-made records: what counts, the set's own aggregate, categories
(a question in two values of one category counts in both) and the retrieval means."""

from __future__ import annotations

import pytest

from tests.evaluation.test_results_header import leaves  # a header's fields as dotted names
from vrag_rollout.evaluation.protocol import Protocol
from vrag_rollout.evaluation.report import build_report, headline, markdown


def record(qid, accuracy, *, answered=True, answerable=True, counted=True, recall=None, sources=("Chart",),
           excluded=None):
    return {"question_id": qid, "set": "slidevqa", "answer": "x" if answered else None, "answerable": answerable,
            "counted": counted, "excluded": excluded, "metrics": {"accuracy": accuracy, "f1": accuracy, "answered": float(answered)},
            "retrieval": None if recall is None else {"recall": recall, "ndcg": recall / 2},
            "categories": {"reasoning_type": list(sources)}}


def test_tables_count_what_the_protocol_counts():
    records = [record("a", 1.0, recall=1.0, sources=("Chart", "Table")),
               record("b", 0.0, recall=0.5),
               record("c", 0.0, answered=False, counted=False, recall=0.0, excluded="capped"),
               record("d", 1.0, answerable=False, counted=False, excluded="unanswerable")]
    header = {"protocol": Protocol(capped="exclude", unanswerable="exclude").to_dict(), "data": "d", "model": "m"}
    report = build_report(records, header)
    bench = report["benchmarks"]["slidevqa"]
    assert (bench["questions"], bench["counted"], bench["excluded_capped"], bench["excluded_unanswerable"]) == (4, 2, 1, 1)
    # SlideVQA's aggregate over a and b: exact match (1 + 0) / 2
    assert bench["scores"]["accuracy"] == pytest.approx(0.5)
    assert bench["retrieval"] == {"questions": 2, "recall": pytest.approx(0.75), "ndcg": pytest.approx(0.375)}
    by_type = bench["categories"]["reasoning_type"]
    assert by_type["Chart"]["questions"] == 4 and by_type["Chart"]["counted"] == 2
    assert by_type["Table"]["questions"] == 1 and by_type["Table"]["scores"]["accuracy"] == 1.0
    text = markdown(report, ["episodes/batch-0001.html"])
    assert "| all | 4 | 2 | 50.0 |" in text and "### slidevqa by reasoning_type" in text
    assert "Left out: 1 without an answer (capped: exclude), 1 unanswerable" in text
    assert "[episodes/batch-0001.html](episodes/batch-0001.html)" in text
    assert "`capped`: exclude" in text and "`judge`: none" in text


def full_header(**protocol) -> dict:
    from vrag_rollout.devkit.evaluate_job import results_header

    return results_header(Protocol(**protocol), data="/data/mmlb.parquet", data_sha256="d" * 64,
                          model="/models/tiny-qwen2-vl", model_fingerprint="feedbeef", scopes=["document"],
                          grammar=True, index={"version": "a1b2c3d4e5f60718", "documents": 3, "pages": 13},
                          sets=["mmlongbench-doc"])


def test_the_report_states_everything_the_results_header_records():
    """report.md alone reproduces the run: every field of the header, by name and value."""
    header = full_header(max_turns=3)
    text = markdown(build_report([record("a", 1.0)], header))
    for name, value in leaves(header):  # None and booleans are said in words ("as converted", "on")
        shown = [] if value is None or isinstance(value, bool) else value if isinstance(value, list) else [value]
        assert name.split(".")[-1] in text and all(str(one) in text for one in shown), (name, value)
    # what the issue found missing: the grammar, the scope the rows were searched in, the model's path
    assert "`grammar`: on" in text and "/models/tiny-qwen2-vl" in text and "feedbeef" in text
    assert "`scope`: as converted: document" in text
    assert "`n`: 1" in text and "`temperature`: 0.0" in text


def sampled(qid, draw, accuracy, f1=None, counted=True, excluded=None):
    metrics = {"accuracy": accuracy, "f1": accuracy if f1 is None else f1, "answered": 1.0}
    return {"question_id": qid, "sample": draw, "set": "slidevqa", "answer": "x", "answerable": True,
            "counted": counted, "excluded": excluded, "metrics": metrics,
            "retrieval": {"recall": float(draw), "ndcg": float(draw) / 2}, "categories": {}}


def test_n_samples_report_pass_at_1_as_the_mean_and_pass_at_k_as_the_best_sample():
    # q1 right once of two; q2 never right (f1 0.5, then 0.2); q3 right twice
    records = [sampled("q1", 0, 1.0), sampled("q1", 1, 0.0), sampled("q2", 0, 0.0, f1=0.5),
               sampled("q2", 1, 0.0, f1=0.2), sampled("q3", 0, 1.0), sampled("q3", 1, 1.0)]
    report = build_report(records, {"protocol": Protocol(n=2, temperature=1.0).to_dict(), "data": "d", "model": "m"})
    bench = report["benchmarks"]["slidevqa"]
    assert (bench["questions"], bench["samples"], bench["counted"]) == (3, 6, 6)
    # pass@1: the set's aggregate per draw (2/3, then 1/3), averaged; counts add up over the draws
    assert bench["scores"]["accuracy"] == pytest.approx(0.5) and bench["scores"]["count"] == 6
    assert bench["scores"]["f1"] == pytest.approx(((1 + 0.5 + 1) / 3 + (0 + 0.2 + 1) / 3) / 2)
    # pass@2: per question its best sample, per metric
    assert bench["pass_at_k"] == {"k": 2, "questions": 3,
                                  "scores": {"accuracy": pytest.approx(2 / 3), "f1": pytest.approx(2.5 / 3)}}
    assert bench["retrieval"]["recall"] == pytest.approx(0.5)  # over every counted sample
    text = markdown(report)
    assert "| questions | samples | counted | mean@2 accuracy | mean@2 f1 | pass@2 accuracy | pass@2 f1 |" in text
    assert "| all | 3 | 6 | 6 | 50.0 |" in text and "| 66.7 | 83.3 |" in text
    assert headline(report) == ["slidevqa: 3 questions x 2 samples, 6 counted; mean@2 accuracy 50.0, f1 61.7; "
                                "pass@2 accuracy 66.7, f1 83.3; recall 50.0, ndcg 25.0, gold shown 50.0"]
    one = build_report(records[:2], report["header"])
    assert headline(one)[0].startswith("slidevqa: 1 question x 2 samples, 2 counted;")


def test_one_sample_keeps_the_plain_table_and_a_capped_sample_is_left_out_of_the_best():
    single = build_report([record("a", 1.0)], {"protocol": Protocol().to_dict(), "data": "d", "model": "m"})
    assert "pass_at_k" not in single["benchmarks"]["slidevqa"] and "pass@" not in markdown(single)
    assert headline(single) == ["slidevqa: 1 of 1 questions counted; accuracy 100.0, f1 100.0; recall -, ndcg -, gold shown -"]
    records = [sampled("q1", 0, 1.0, counted=False, excluded="capped"), sampled("q1", 1, 0.0),
               sampled("q2", 0, 0.0, counted=False, excluded="capped"), sampled("q2", 1, 0.0, counted=False,
                                                                                excluded="capped")]
    report = build_report(records, {"protocol": Protocol(n=2, temperature=1.0, capped="exclude").to_dict(),
                                    "data": "d", "model": "m"})
    bench = report["benchmarks"]["slidevqa"]
    assert bench["pass_at_k"]["questions"] == 1 and bench["pass_at_k"]["scores"]["accuracy"] == 0.0
    assert bench["excluded_capped"] == 3 and bench["counted"] == 1
