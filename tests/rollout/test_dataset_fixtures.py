"""vrag-rollout record-fixtures --data (vrag_rollout.data.fixture_calls): the calls a converted
dataset's questions can make, recorded from the real server on the sample corpus and replayed."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vrag_rollout.cli import main as cli_main
from vrag_rollout.data import dataset
from vrag_rollout.data.fixture_calls import (
    DEFAULT_TOP_N,
    dataset_doc_ids,
    dataset_retrieval_calls,
    read_queries,
    record_dataset_fixtures,
)
from vrag_rollout.retrieval.client import RetrieverClient
from vrag_rollout.retrieval.fixtures import FixtureMiss, FixtureTransport
from vrag_rollout.retrieval.types import FetchSpec


def question(uid, file_name, pages=(1,)):
    return {"uid": uid, "query": "Where?", "reference_answer": "here",
            "meta_info": {"file_name": file_name, "reference_page": list(pages)}}


def write_dataset(tmp_path: Path, rows, index=None) -> Path:
    src = tmp_path / "qa.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    dataset.convert_dataset(src, tmp_path / "train.parquet", index_dir=index)
    return tmp_path / "train.parquet"


def test_the_calls_are_every_query_and_every_page_of_each_dataset_document():
    searches, fetches = dataset_retrieval_calls(["b", "a", "a"], {"a": 2, "b": 1, "c": 9}, ["q1", "q2"])
    assert searches == [("a", "q1"), ("a", "q2"), ("b", "q1"), ("b", "q2")]
    assert fetches == [("a", "image, 1"), ("a", "image, 2"), ("a", "text, 1"), ("a", "text, 2"),
                       ("b", "image, 1"), ("b", "text, 1")]
    assert dataset_retrieval_calls(["a"], {"a": 1}, modes=("text",)) == ([], [("a", "text, 1")])
    with pytest.raises(ValueError, match=r"1 dataset document\(s\) not served by the retriever: 'gone'"):
        dataset_retrieval_calls(["a", "gone"], {"a": 1})


def test_queries_file_and_dataset_documents(tmp_path):
    (tmp_path / "q.txt").write_text("revenue\n\n  margin  \nrevenue\n")
    assert read_queries(tmp_path / "q.txt") == ["revenue", "margin"]
    (tmp_path / "none.txt").write_text("\n \n")
    with pytest.raises(ValueError, match="no queries"):
        read_queries(tmp_path / "none.txt")
    data = write_dataset(tmp_path, [question("a", "x/b.pdf"), question("b", "a.pdf"), question("c", "b.pdf")])
    assert dataset_doc_ids(data) == ["a", "b"]
    pq.write_table(pa.table({"question": ["x"]}), tmp_path / "other.parquet")
    with pytest.raises(dataset.DatasetError, match="field 'doc_id': no such column"):
        dataset_doc_ids(tmp_path / "other.parquet")


@pytest.fixture(scope="module")
def sample_index():
    from vrag_rollout.devkit.demo import cache_dir, prepare_index

    return prepare_index(cache_dir())


@pytest.fixture(scope="module")
def live_url(sample_index):
    from retriever_server.api.testing import serve_in_thread

    with serve_in_thread(sample_index) as url:
        yield url


@pytest.mark.process
def test_recorded_dataset_calls_replay_as_the_live_server_answers(tmp_path, sample_index, live_url, capsys):
    pages = dataset.index_documents(sample_index)
    data = write_dataset(tmp_path, [question("a", "annual_report.pdf", [2]), question("s", "safety_manual.pdf", [5]),
                                    question("a2", "annual_report.pdf", [1])], index=sample_index)
    (tmp_path / "queries.txt").write_text("segment revenue and EBITDA margin\nflammable solvents cabinet\n")
    out = tmp_path / "data_fixtures.json"
    assert cli_main(["record-fixtures", "--data", str(data), "--index", str(sample_index),
                     "--queries", str(tmp_path / "queries.txt"), "--out", str(out)]) == 0
    assert "'documents': 2" in capsys.readouterr().out

    recorded = json.loads(out.read_text())
    docs = ["annual_report", "safety_manual"]
    assert sorted((e["doc_id"], e["spec"]) for e in recorded["fetch"]) == sorted(
        (doc, f"{mode}, {page}") for doc in docs for mode in ("image", "text") for page in range(1, pages[doc] + 1))
    assert sorted((e["doc_id"], e["query"], e["top_n"]) for e in recorded["search"]) == [
        (doc, query, DEFAULT_TOP_N) for doc in docs
        for query in ("flammable solvents cabinet", "segment revenue and EBITDA margin")]

    # one search and one fetch replay as the live server answers them
    query, spec = "segment revenue and EBITDA margin", FetchSpec("text", 3)
    with RetrieverClient(live_url, binary=False) as live, \
            RetrieverClient(None, transport=FixtureTransport.load(out)) as replay:
        [live_hits], [replayed_hits] = (c.batch_search([query], ["annual_report"], DEFAULT_TOP_N) for c in (live, replay))
        assert [(h.page_id, h.contents) for h in replayed_hits] == [(h.page_id, h.contents) for h in live_hits]
        [live_page], [replayed_page] = (c.batch_fetch([spec], ["annual_report"]) for c in (live, replay))
        assert (replayed_page.page_id, replayed_page.contents) == (live_page.page_id, live_page.contents)
        with pytest.raises(FixtureMiss):  # the sample corpus's third document is not in the dataset
            replay.batch_fetch([spec], ["product_guide"])

    # a bare URL gives its page counts by GET /documents: the same recording, byte for byte
    again = tmp_path / "by_url.json"
    record_dataset_fixtures(data, again, queries=tmp_path / "queries.txt", retriever_url=live_url)
    assert again.read_bytes() == out.read_bytes()


def test_record_fixtures_data_names_what_is_wrong(tmp_path, sample_index, capsys):
    data = write_dataset(tmp_path, [question("a", "annual_report.pdf"), question("m", "memo.pdf")])
    out = tmp_path / "f.json"
    assert cli_main(["record-fixtures", "--data", str(data), "--index", str(sample_index), "--out", str(out)]) == 2
    assert "not served by the retriever: 'memo'" in capsys.readouterr().err
    assert cli_main(["record-fixtures", "--data", str(data), "--index", str(tmp_path), "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith(f"record-fixtures: --index {tmp_path}: no manifest.json")
    assert not out.exists()
    with pytest.raises(SystemExit):  # the demo's calls are fixed
        cli_main(["record-fixtures", "--queries", "q.txt", "--out", str(out)])
    assert "only with --data" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["record-fixtures", "--data", str(data), "--out", str(out)])
    assert "needs --index" in capsys.readouterr().err
