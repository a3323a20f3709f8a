"""The retriever-only track: each metric against a hand-worked example (the arithmetic in the
comments), the track's per-scope metrics, and `evaluate-retriever` end to end on the sample
corpus: BM25 on the BM25 index (pure), and BM25, dense and fused on a dense index (the tiny
ColQwen2; its rankings are random, so only the metrics recomputed here from its recorded rankings
are checked)."""

from __future__ import annotations

import json
import math

import pytest

from tests.rollout.test_converted_sets_roll_out import facts
from vrag_rollout.evaluation.retriever_metrics import (mmdocir_page_recall, ndcg_at_k, recall_at_k,
                                                       vidore_ndcg_at_10)
from vrag_rollout.evaluation.retriever_track import build_report, markdown, question_metrics

RANKED = ["A", "B", "C", "D", "E"]
GOLD = {"B", "E", "Z"}  # Z is never ranked


def test_recall_at_k_by_hand():
    assert recall_at_k(RANKED, GOLD, 1) == 0.0  # A: no gold
    assert recall_at_k(RANKED, GOLD, 3) == pytest.approx(1 / 3)  # B of B, E, Z
    assert recall_at_k(RANKED, GOLD, 5) == pytest.approx(2 / 3)  # B and E
    assert recall_at_k(["B", "B", "A"], {"A"}, 2) == 1.0  # the repeat is dropped: [B, A]
    assert recall_at_k(RANKED, set(), 3) is None  # nothing to find: not scored


def test_ndcg_at_k_by_hand():
    # @3: DCG = 1/log2(3) (B at place 2) = 0.63093; IDCG = 1 + 1/log2(3) + 1/log2(4) = 2.13093
    assert ndcg_at_k(RANKED, GOLD, 3) == pytest.approx(0.63093 / 2.13093, abs=1e-5)
    # @5: DCG = 1/log2(3) + 1/log2(6) (E at place 5) = 0.63093 + 0.38685; IDCG stays 2.13093 (3 gold)
    assert ndcg_at_k(RANKED, GOLD, 5) == pytest.approx(1.01778 / 2.13093, abs=1e-5)
    # one gold page at place 2 of [B, A] (the repeat dropped): 1/log2(3) over IDCG 1
    assert ndcg_at_k(["B", "B", "A"], {"A"}, 2) == pytest.approx(0.63093, abs=1e-5)
    assert ndcg_at_k(["A"], {"A"}, 10) == 1.0


def test_mmdocir_page_recall_by_hand():
    ranked = [("d", 3), ("d", 1), ("d", 7), ("d", 2), ("d", 9)]
    gold = {("d", 1), ("d", 2)}
    # top 1: page 3 (none); top 3: page 1 (1 of 2); top 5: pages 1 and 2 (2 of 2)
    assert [mmdocir_page_recall(ranked, gold, k) for k in (1, 3, 5)] == [0.0, 0.5, 1.0]


def test_vidore_ndcg_at_10_by_hand():
    pool = [("d", page) for page in range(1, 13)]
    # the one gold page at place 4: 1/log2(5) = 0.43068, over IDCG 1
    assert vidore_ndcg_at_10(pool, {("d", 4)}) == pytest.approx(0.43068, abs=1e-5)
    assert vidore_ndcg_at_10(pool, {("d", 11)}) == 0.0  # past the cut at 10
    # two gold pages at places 1 and 3: (1 + 1/log2(4)) / (1 + 1/log2(3)) = 1.5 / 1.63093
    assert vidore_ndcg_at_10(pool, {("d", 1), ("d", 3)}) == pytest.approx(1.5 / 1.63093, abs=1e-5)


def test_each_published_metric_is_reported_in_its_own_scope():
    corpus = question_metrics(RANKED, GOLD, "corpus", [1, 3])
    document = question_metrics(RANKED, GOLD, "document", [1, 3])
    assert set(corpus) == {"recall@1", "ndcg@1", "recall@3", "ndcg@3", "vidore_ndcg@10"}
    assert set(document) == {"recall@1", "ndcg@1", "recall@3", "ndcg@3", "mmdocir_recall@1", "mmdocir_recall@3",
                             "mmdocir_recall@5"}
    assert question_metrics(RANKED, set(), "corpus", [1]) == {}
    records = [{"set": "s", "retriever": "bm25", "scope": "corpus", "question_id": "a",
                "metrics": {"recall@1": 1.0}},
               {"set": "s", "retriever": "bm25", "scope": "corpus", "question_id": "b", "metrics": {"recall@1": 0.0}},
               {"set": "s", "retriever": "bm25", "scope": "corpus", "question_id": "c", "metrics": {}}]
    report = build_report(records, {"data": "d"})
    row = report["sets"]["s"][0]
    assert (row["questions"], row["no_gold"], row["means"]) == (2, 1, {"recall@1": 0.5})
    assert "| bm25 | corpus | 2 | 50.0 |" in markdown(report) and "1 question rows without a gold page" in markdown(report)


def converted_facts(tmp_path, index):
    from tests.rollout.test_converted_sets_roll_out import written_in
    from vrag_rollout.data import dataset

    out = tmp_path / "mmlb.parquet"
    dataset.convert_dataset(written_in("mmlongbench-doc", tmp_path), out, index_dir=index,
                            source_format="mmlongbench-doc")
    return out


def recomputed(record: dict) -> dict:
    """The record's metrics, from its recorded ranking and gold pages, by the definitions."""
    ranked, gold = [tuple(page) for page in record["ranked"]], {tuple(page) for page in record["gold"]}
    out = {}
    for k in (1, 3):
        out[f"recall@{k}"] = len(set(ranked[:k]) & gold) / len(gold)
        dcg = sum(1 / math.log2(i + 2) for i, page in enumerate(ranked[:k]) if page in gold)
        out[f"ndcg@{k}"] = dcg / sum(1 / math.log2(i + 2) for i in range(min(k, len(gold))))
    return out


def test_evaluate_retriever_on_the_bm25_index(tmp_path, capsys):
    from vrag_rollout.cli import main
    from vrag_rollout.devkit.demo import cache_dir, prepare_index

    index = prepare_index(cache_dir())
    data = converted_facts(tmp_path, index)
    assert main(["evaluate-retriever", "--data", str(data), "--index", str(index), "--out", str(tmp_path / "t"),
                 "--k", "1", "3"]) == 0
    assert "| bm25 | document | 2 |" in capsys.readouterr().out
    lines = (tmp_path / "t" / "retriever.jsonl").read_text().splitlines()
    header, records = json.loads(lines[0])["header"], [json.loads(line) for line in lines[1:]]
    assert header["retrievers"] == ["bm25"] and header["index"]["documents"] == 3 and header["ks"] == [1, 3]
    assert len(records) == 2 * len(facts())  # each question in each scope
    for record in records:
        assert len(record["ranked"]) == 10 or record["scope"] == "document"
        if record["scope"] == "document":  # its own document's pages only
            assert {doc for doc, _ in record["ranked"]} == {record["gold"][0][0]}
        mine = {name: value for name, value in record["metrics"].items() if name[-2:] in ("@1", "@3")
                and not name.startswith("mmdocir")}
        assert mine == pytest.approx(recomputed(record))
    assert main(["evaluate-retriever", "--data", str(data), "--index", str(index), "--out", str(tmp_path / "u"),
                 "--retriever", "dense"]) == 2
    assert "this index ranks with bm25 only" in capsys.readouterr().err


def _dense_track(base):
    from tests.retriever.dense_support import dense_index
    from vrag_rollout.devkit.evaluate_retriever_job import run_retriever_track

    index = dense_index(base, search="hybrid")
    return run_retriever_track(base / "track", data=converted_facts(base, index), index=index, ks=(1, 3))


@pytest.mark.process  # the tiny ColQwen2 encodes the pages in worker processes
def test_evaluate_retriever_scores_bm25_dense_and_fused_in_both_scopes(tmp_path):
    report = _dense_track(tmp_path)
    rows = report["sets"]["mmlongbench-doc"]
    assert {(row["retriever"], row["scope"]) for row in rows} == {
        (name, scope) for name in ("bm25", "dense", "hybrid") for scope in ("corpus", "document")}
    lines = (tmp_path / "track" / "retriever.jsonl").read_text().splitlines()[1:]
    for record in map(json.loads, lines):
        mine = {name: value for name, value in record["metrics"].items() if name in recomputed(record)}
        assert mine == pytest.approx(recomputed(record)), record
    assert "| hybrid | document | 2 |" in (tmp_path / "track" / "retriever_report.md").read_text()
