"""The evaluation's protocol switches, its resumable results file and its retrieval metrics, each
against hand-worked cases."""

from __future__ import annotations

import json
import math

import pytest

from vrag_rollout.evaluation.protocol import Protocol
from vrag_rollout.evaluation.results import ResultsBusy, ResultsFile, ResultsMismatch
from vrag_rollout.evaluation.retrieval import retrieval_metrics


# ---- retrieval metrics, counted by hand ----
def test_recall_per_turn_and_cumulative_count_document_and_page():
    truth = {"answer": "x", "doc_id": None, "gold_pages": [["report", 3], ["report", 5], ["deck", 2]]}
    turns = [["manual_3", "report_3"],  # report_3 is gold (manual_3 is page 3 of another document)
             [],  # an error observation: nothing shown
             ["report_3", "deck_2", "report_4"]]  # deck_2 new, report_3 again
    found = retrieval_metrics(turns, truth)
    assert found["gold"] == 3
    assert found["recall_per_turn"] == [1 / 3, 0.0, 2 / 3]
    assert found["recall_cumulative"] == [1 / 3, 1 / 3, 2 / 3]
    assert found["recall"] == 2 / 3
    # distinct pages in order first shown: manual_3, report_3 (gold, rank 2), deck_2 (gold, rank 3), report_4
    dcg = 1 / math.log2(3) + 1 / math.log2(4)
    ideal = 1 + 1 / math.log2(3) + 1 / math.log2(4)
    assert found["ndcg"] == pytest.approx(dcg / ideal)


def test_document_scope_gold_pages_and_no_gold():
    truth = {"answer": "x", "doc_id": "report", "gold_pages": [2]}
    assert retrieval_metrics([["report_1"], ["report_2"]], truth)["recall_cumulative"] == [0.0, 1.0]
    assert retrieval_metrics([["other_2"]], truth)["recall"] == 0.0
    assert retrieval_metrics([], truth)["recall"] == 0.0  # answered without retrieving
    assert retrieval_metrics([["report_1"]], {"answer": "Not answerable", "doc_id": "report", "gold_pages": []}) is None


# ---- the protocol ----
def test_protocol_switches_decide_what_counts():
    default = Protocol()
    assert default.counts(answered=False, answerable=True)  # capped: wrong, scored 0
    assert not Protocol(capped="exclude").counts(answered=False, answerable=True)
    assert Protocol(capped="exclude").counts(answered=True, answerable=True)
    assert default.counts(answered=True, answerable=False)
    assert not Protocol(unanswerable="exclude").counts(answered=True, answerable=False)
    for bad in ({"scope": "everything"}, {"capped": "maybe"}, {"unanswerable": "skip"}, {"max_turns": 0},
                {"max_turns": True}):
        with pytest.raises(ValueError):
            Protocol(**bad)
    assert Protocol(scope="corpus").to_dict()["scope"] == "corpus"
    # an unanswerable question left without an answer, unanswerable questions scored: the capped switch
    assert Protocol(capped="exclude").excluded_by(answered=False, answerable=False) == "capped"
    assert Protocol(unanswerable="exclude").excluded_by(answered=False, answerable=False) == "unanswerable"
    assert default.excluded_by(answered=False, answerable=False) is None


def test_samples_per_question_need_a_temperature():
    assert (Protocol().n, Protocol().temperature) == (1, 0.0)  # greedy, one sample: as the papers score
    assert Protocol(n=4, temperature=0.7).to_dict()["n"] == 4
    for bad, says in (({"n": 0}, "n must be"), ({"n": True}, "n must be"), ({"temperature": -0.5}, "temperature"),
                      ({"n": 2}, "the same answer")):  # greedy draws one answer n times
        with pytest.raises(ValueError, match=says):
            Protocol(**bad)


# ---- results.jsonl ----
def test_results_resume_keeps_records_and_drops_a_cut_line(tmp_path):
    header = {"protocol": Protocol().to_dict(), "data": "d.parquet", "model": "m"}
    path = tmp_path / "out" / "results.jsonl"
    with ResultsFile.open(path, header) as first:
        first.append([{"question_id": "a", "x": 1}, {"question_id": "b", "x": 2}])
        with pytest.raises(ResultsBusy):  # one run at a time writes a file
            ResultsFile.open(path, header)
    with path.open("a", encoding="utf-8") as f:
        f.write('{"question_id": "c", "x"')  # the write an interruption cut off
    with ResultsFile.open(path, header) as again:
        assert again.done == {"a", "b"} and [r["x"] for r in again.records] == [1, 2]
        assert path.read_text().count("\n") == 3 and '"c"' not in path.read_text()  # the cut line is gone
        again.append([{"question_id": "c", "x": 3}])
    assert [json.loads(line)["question_id"] for line in path.read_text().splitlines()[1:]] == ["a", "b", "c"]


def test_a_bad_middle_line_is_skipped_and_a_repeated_question_keeps_its_first_record(tmp_path):
    header = {"protocol": {}, "data": "d", "model": "m"}
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join([json.dumps({"header": header}), '{"question_id": "a", "x": 1}', "garbage",
                               '{"question_id": "b", "x": 2}', '{"question_id": "a", "x": 9}']) + "\n")
    with ResultsFile.open(path, header) as found:
        assert [(r["question_id"], r["x"]) for r in found.records] == [("a", 1), ("b", 2)] and found.skipped == 1


def test_samples_of_one_question_are_kept_apart_and_a_question_is_complete_with_all(tmp_path):
    path = tmp_path / "results.jsonl"
    with ResultsFile.open(path, {"protocol": {}, "data": "d", "model": "m"}) as first:
        first.append([{"question_id": "a", "sample": 0}, {"question_id": "a", "sample": 1},
                      {"question_id": "b", "sample": 0}])  # b's second sample was cut off
        assert first.complete(2) == {"a"} and first.complete(1) == {"a", "b"}
        # b rolled out again: the sample already there keeps its first record
        first.append([{"question_id": "b", "sample": 0, "again": True}, {"question_id": "b", "sample": 1}])
    with ResultsFile.open(path, {"protocol": {}, "data": "d", "model": "m"}) as again:
        assert [(r["question_id"], r["sample"], "again" in r) for r in again.records] == [
            ("a", 0, False), ("a", 1, False), ("b", 0, False), ("b", 1, False)]
        assert again.complete(2) == {"a", "b"}


def test_results_refuse_another_protocol(tmp_path):
    path = tmp_path / "results.jsonl"
    ResultsFile.open(path, {"protocol": Protocol().to_dict(), "data": "d", "model": "m"}).close()
    with pytest.raises(ResultsMismatch, match="protocol"):
        ResultsFile.open(path, {"protocol": Protocol(scope="corpus").to_dict(), "data": "d", "model": "m"})
    path.write_text("not json\n")
    with pytest.raises(ResultsMismatch, match="not an evaluation"):
        ResultsFile.open(path, {"protocol": {}, "data": "d", "model": "m"})


def test_gold_page_numbers_without_a_document_match_by_number_as_the_reward_does():
    found = retrieval_metrics([["rep_3"]], {"answer": "x", "doc_id": None, "gold_pages": [3]})
    assert found["recall"] == 1.0 and found["ndcg"] == 1.0
