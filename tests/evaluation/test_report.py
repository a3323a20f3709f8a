"""The report's tables from hand-made records: what counts, the set's own aggregate, categories
(a question in two values of one category counts in both) and the retrieval means."""

from __future__ import annotations

import pytest

from vrag_rollout.evaluation.protocol import Protocol
from vrag_rollout.evaluation.report import build_report, markdown


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
