"""Named protocols (their settings, overrides recorded), the merged corpus's rules (pure, on
hand-made rows) and `evaluate --compare` on hand-made reports: differences named, no difference
column across two protocols, a run whose report and results disagree refused."""

from __future__ import annotations

import json

import pytest

from vrag_rollout.cli import build_parser
from vrag_rollout.data.merge import MergeError, documents_by_origin, merge_columns
from vrag_rollout.devkit.evaluate_job import compare_runs
from vrag_rollout.devkit.job_checks import JobInputError
from vrag_rollout.evaluation.compare import compare, markdown
from vrag_rollout.evaluation.protocol import Protocol
from vrag_rollout.evaluation.protocols import NAMED, named
from vrag_rollout.evaluation.report import build_report


def test_each_named_protocol_and_its_overrides():
    vrag = named("vrag-rl")
    assert (vrag.scope, vrag.max_turns, vrag.search_required, vrag.name, vrag.overrides) == (
        "corpus", 4, True, "vrag-rl", None)
    assert vrag.requires_search("mmlongbench-doc")  # VRAG-RL's rule on every set
    document = named("document", {"max_turns": 6, "top_n": 3})  # top_n: the protocol's own value, no override
    assert (document.scope, document.search_required, document.max_turns) == ("document", False, 6)
    assert document.overrides == {"max_turns": 4}
    own = named("own")
    assert own.to_dict() == {**Protocol().to_dict(), "name": "own", "overrides": None}
    assert set(NAMED) == {"vrag-rl", "document", "own"}
    with pytest.raises(ValueError, match="protocol must be one of"):
        named("alden")


def test_the_command_line_records_only_the_flags_given_as_overrides():
    args = build_parser().parse_args(["evaluate", "--data", "q", "--index", "i", "--out", "o", "--protocol",
                                      "vrag-rl", "--scope", "document", "--search-required", "set"])
    assert (args.protocol, args.scope, args.max_turns, args.search_required) == ("vrag-rl", "document", None, "set")


def row(qid, doc, pages, set_name="slidevqa", count=4):
    truth = {"answer": "x", "doc_id": doc, "gold_pages": pages}
    return {"prompt": "Instructions\nQuestion: q?", "answer": json.dumps(truth), "doc_id": doc,
            "gold_pages": json.dumps(pages), "question_id": qid, "page_count": count,
            "eval": json.dumps({"set": set_name, "document": doc, "answer_format": None, "categories": {}})}


def test_merging_puts_every_row_in_corpus_scope_with_its_origin():
    a = ({"file": "a.parquet", "sha256": "1"}, [row("q1", "deck", [2])])
    b = ({"file": "b.parquet", "sha256": "2"}, [row("q1", "report", [1, 3], "mmlongbench-doc", 5)])
    columns = merge_columns([a, b], {"deck": 4, "report": 5})
    assert columns["question_id"] == ["a/q1", "b/q1"] and columns["doc_id"] == [None, None]
    assert [json.loads(g) for g in columns["gold_pages"]] == [[["deck", 2]], [["report", 1], ["report", 3]]]
    assert json.loads(columns["answer"][1])["doc_id"] is None
    infos = [json.loads(info) for info in columns["eval"]]
    assert [(i["set"], i["document"], i["origin"]["file"]) for i in infos] == [
        ("slidevqa", "deck", "a.parquet"), ("mmlongbench-doc", "report", "b.parquet")]
    assert documents_by_origin(columns) == {"a.parquet": ["deck"], "b.parquet": ["report"]}
    with pytest.raises(MergeError, match="'report' is not in the merged index"):
        merge_columns([b], {"deck": 4})
    with pytest.raises(MergeError, match="had 5 pages when converted, the merged index's has 9"):
        merge_columns([b], {"report": 9})


def bench_record(qid, accuracy, shown):
    return {"question_id": qid, "set": "slidevqa", "answer": "x", "answerable": True, "counted": True,
            "excluded": None, "metrics": {"accuracy": accuracy, "f1": accuracy, "answered": 1.0},
            "retrieval": {"recall": float(shown), "ndcg": float(shown), "recall_cumulative": [float(shown)]},
            "categories": {"reasoning_type": ["Chart"]}}


def report_of(protocol, accuracies):
    records = [bench_record(f"q{i}", acc, shown=i % 2 == 0) for i, acc in enumerate(accuracies)]
    return build_report(records, {"protocol": protocol.to_dict(), "data": "d", "model": "m"})


def test_compare_subtracts_only_within_one_protocol():
    a = report_of(named("document"), [1.0, 0.0, 1.0, 0.0])
    b = report_of(named("document"), [1.0, 1.0, 1.0, 1.0])
    same = compare(a, b)
    assert same["same_protocol"] and same["differences"] == {"protocol": [], "setup": []}
    rows = {r["row"]: r for r in same["sets"]["slidevqa"]}
    assert set(rows) == {"all", "gold shown", "never shown", "reasoning_type=Chart"}
    assert rows["all"]["scores"]["accuracy"] == {"a": 0.5, "b": 1.0, "delta": 0.5}
    assert rows["never shown"]["scores"]["accuracy"] == {"a": 0.0, "b": 1.0, "delta": 1.0}  # q1, q3
    assert "| all | 4 | 4 | 50.0 | 100.0 | 50.0 |" in markdown(same)
    other = compare(a, report_of(named("vrag-rl"), [1.0, 1.0, 1.0, 1.0]))
    assert other["differences"]["protocol"] == ["protocol.name", "protocol.scope", "protocol.search_required"]
    assert "delta" not in other["sets"]["slidevqa"][0]["scores"]["accuracy"]
    text = markdown(other)
    assert "B - A" not in text and "`protocol.scope`: 'document' in A, 'corpus' in B" in text


def test_a_run_whose_report_and_results_disagree_is_refused(tmp_path):
    for name, protocol in (("a", named("own")), ("b", named("own"))):
        run = tmp_path / name
        run.mkdir()
        report = report_of(protocol, [1.0, 0.0])
        (run / "report.json").write_text(json.dumps(report))
        written = report["header"] if name == "a" else {**report["header"], "protocol": named("vrag-rl").to_dict()}
        (run / "results.jsonl").write_text(json.dumps({"header": written}) + "\n")
    assert "Same protocol" in compare_runs(tmp_path / "a", tmp_path / "a")
    with pytest.raises(JobInputError, match="one column would hold two protocols"):
        compare_runs(tmp_path / "a", tmp_path / "b")
    with pytest.raises(JobInputError, match="not an evaluation's directory"):
        compare_runs(tmp_path / "a", tmp_path / "none")
