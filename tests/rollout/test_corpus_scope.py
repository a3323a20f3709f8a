"""Corpus scope on the rollout's side, without an engine: which document each call reads, what
goes on the wire, the converted rows and the reward's retrieval part (`core.scope`)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from vrag_rollout.cli import main as cli_main
from vrag_rollout.core.actions import Crop, Fetch, Search, ToolCall
from vrag_rollout.core.episode import Episode
from vrag_rollout.core.regions import RELATIVE_1000, Region, RegionRequest
from vrag_rollout.core.reward import parse_ground_truth, retrieval_score, score_response, ndcg
from vrag_rollout.core.scope import NO_CURRENT_DOCUMENT, call_document, current_document
from vrag_rollout.data import dataset
from vrag_rollout.data.questions import read_questions, written_for
from vrag_rollout.formats import TagFormat, ToolCallFormat
from vrag_rollout.retrieval.fixtures import Fixtures
from vrag_rollout.retrieval.types import RetrievedPage, RetrieverFailure
from vrag_rollout.retrieval.wire import parse_search_results, search_body
from vrag_rollout.rollout.tools import REQUEST_FAILURE, call_retriever
from vrag_rollout.verify.episode_facts import is_gold, parse_truth

from .test_sources import rows_of, slide_qa, write_jsonl


# ---- which document a call reads ----
def test_current_document_is_the_rows_or_the_last_page_shown():
    assert current_document("report", [["deck_2"]]) == "report"  # document scope never moves
    assert current_document(None, []) is None
    assert current_document(None, [["report_3", "deck_7_12"], []]) == "deck_7"  # doc ids hold underscores
    assert current_document(None, [["report_3"], ["manual_1"], []]) == "manual"


def test_call_document_per_action():
    shown = [["report_3", "deck_7_12"]]
    assert call_document(Search("q"), None, shown) is None  # the whole corpus
    assert call_document(Search("q"), "report", shown) == "report"
    assert call_document(Fetch("image", 2), None, shown) == "deck_7"
    request = RegionRequest(3, Region(0.1, 0.1, 0.5, 0.5), "report_3")
    assert call_document(request, None, shown) == "report"  # a crop reads the page it names


class _Recorder:
    """A client stand-in that records what each batch asked (the calls' routing is under test)."""

    def __init__(self):
        self.searches, self.fetches = [], []

    def batch_search(self, queries, doc_ids, top_n):
        self.searches.append(list(doc_ids))
        return [[RetrievedPage(f"{d or 'x'}_1", d or "x", 1, "image", "")] for d in doc_ids]

    def batch_fetch(self, specs, doc_ids):
        self.fetches.append(list(doc_ids))
        return [RetrievedPage(f"{d}_{s.page}", d, s.page, s.modality, "") for s, d in zip(specs, doc_ids)]


def test_corpus_search_goes_out_without_a_document_and_a_fetch_without_one_is_the_policys_mistake():
    client = _Recorder()
    calls = [ToolCall(0, Search("revenue"), None), ToolCall(1, Search("revenue"), "report"),
             ToolCall(2, Fetch("image", 3), None), ToolCall(3, Fetch("image", 3), "deck_7")]
    outcomes = call_retriever(calls, client, top_n=2)
    assert client.searches == [[None, "report"]] and client.fetches == [["deck_7"]]
    assert isinstance(outcomes[0], list) and isinstance(outcomes[1], list)
    assert outcomes[2] == RetrieverFailure(REQUEST_FAILURE, NO_CURRENT_DOCUMENT)
    assert outcomes[3].page_id == "deck_7_3"


def _episode(doc_id=None, page_ids=()):
    episode = Episode(index=0, prompt_engine_ids=[1], prompt_images=[], doc_id=doc_id, response_length=64,
                      max_images=4)
    episode.page_ids = [list(p) for p in page_ids]
    return episode


@pytest.mark.parametrize("fmt", [TagFormat, ToolCallFormat])
def test_each_format_routes_fetches_to_the_current_document(fmt):
    from types import SimpleNamespace

    action_format = fmt.__new__(fmt)  # only the routing runs: no tokenizer or template needed
    action_format.fetch_modes, action_format.regions, action_format.frame = ("image", "text"), False, RELATIVE_1000
    fresh, browsing, scoped = _episode(), _episode(page_ids=[["deck_7_12"]]), _episode("report", [["report_2"]])
    if fmt is TagFormat:
        calls = [(fresh, Fetch("image", 3)), (browsing, Fetch("text", 3)), (scoped, Search("q")), (browsing, Search("q"))]
    else:
        turn = lambda *actions: SimpleNamespace(calls=list(actions))  # noqa: E731
        calls = [(fresh, turn(Fetch("image", 3))), (browsing, turn(Fetch("text", 3))), (scoped, turn(Search("q"))),
                 (browsing, turn(Search("q")))]
    assert [call.doc_id for call in action_format.requests(calls)] == [None, "deck_7", "report", None]


def test_a_crop_in_corpus_scope_names_the_current_documents_page():
    from vrag_rollout.formats.region_requests import resolved
    from vrag_rollout.core.regions import RegionError

    class Shown:
        class image:
            size = (100, 200)

    episode = _episode(page_ids=[["deck_7_12", "report_3"]])
    episode.shown_pages = {"deck_7_12": Shown(), "report_3": Shown()}
    episode.last_page_id = "report_3"
    request = resolved(Crop(3, (0, 0, 500, 500)), episode, RELATIVE_1000)
    assert request.page_id == "report_3" and call_document(request, None, episode.page_ids) == "report"
    assert isinstance(resolved(Crop(12, (0, 0, 500, 500)), episode, RELATIVE_1000), RegionError)  # deck's 12: not current
    bbox = resolved(Crop(None, (0, 0, 500, 500)), episode, RELATIVE_1000)
    assert bbox.page_id == "report_3"


# ---- the wire ----
def test_search_body_writes_null_for_the_corpus_and_doc_scoped_bodies_are_unchanged():
    assert search_body(["a", "b"], ["report", "deck"], 3) == {"query": ["a", "b"], "id": ["report", "deck"],
                                                              "top_n": 3, "return_score": False}
    assert json.dumps(search_body(["a"], [None], 3)) == '{"query": ["a"], "id": [null], "top_n": 3, "return_score": false}'


def test_corpus_hits_carry_their_own_documents():
    answer = [[{"id": "deck_7_12", "contents": "x", "doc_id": "deck_7", "page": 12},
               {"id": "report_3", "contents": "y"}],  # an older server: the page id says the document
              [{"id": "report_3", "contents": "y", "doc_id": "report", "page": 3}],
              [{"id": "garbage", "contents": "z"}]]
    found = parse_search_results(answer, [None, "report", None], 3)
    assert [(p.doc_id, p.page, p.page_id) for p in found[0]] == [("deck_7", 12, "deck_7_12"), ("report", 3, "report_3")]
    assert [(p.doc_id, p.page) for p in found[1]] == [("report", 3)]
    assert isinstance(found[2], RetrieverFailure) and found[2].kind == "malformed"


def test_fixtures_record_and_replay_corpus_searches():
    fixtures = Fixtures()
    fixtures.add_search("report", "q", 2, [{"id": "report_1", "contents": "a"}])
    fixtures.add_search(None, "q", 2, [{"id": "deck_7_1", "contents": "b", "doc_id": "deck_7"}])
    text = fixtures.to_json()
    again = Fixtures.from_json(text)
    assert again.search[(None, "q", 2)][0]["id"] == "deck_7_1" and again.to_json() == text
    assert text.index('"doc_id": null') < text.index('"doc_id": "report"')  # corpus searches first


# ---- the reward and the checker's truth ----
def test_retrieval_reward_counts_document_and_page():
    truth = {"answer": "x", "doc_id": None, "gold_pages": [["report", 3], ["deck_7", 12]],
             "page_ids": [["manual_3", "report_3"], ["deck_7_12"]]}
    # ranked: manual_3 (no), report_3 (gold), deck_7_12 (gold); manual's page 3 is not report's
    assert retrieval_score(parse_ground_truth(truth)) == pytest.approx(ndcg([0, 1, 2], {1, 2}))
    assert retrieval_score(parse_ground_truth({**truth, "page_ids": [["manual_3"]]})) == 0.0
    assert score_response("<answer>x</answer>", json.dumps(truth))["retrieval"] > 0.6
    with pytest.raises(ValueError, match="pairs"):
        parse_ground_truth({"answer": "x", "gold_pages": [["report"]]})
    seen = parse_truth(json.dumps(truth))
    assert is_gold("deck_7_12", seen) and not is_gold("manual_3", seen) and not is_gold("deck_7_3", seen)


# ---- converting a set ----
def test_each_set_has_its_scope_and_corpus_rows_name_their_pages(tmp_path):
    src = write_jsonl(tmp_path / "test.jsonl", [slide_qa(101), slide_qa(102, deck="v2.0-roadmap", pages=[1, 20])])
    report = dataset.convert_dataset(src, tmp_path / "s.parquet", source_format="slidevqa")
    assert report.scope == "corpus" and report.to_dict()["scope"] == "corpus"
    rows = rows_of(tmp_path / "s.parquet")
    assert [r["doc_id"] for r in rows] == [None, None]
    assert rows[1]["gold_pages"] == [["v2.0-roadmap", 1], ["v2.0-roadmap", 20]]
    assert rows[1]["answer"] == {"answer": "42%", "doc_id": None, "gold_pages": [["v2.0-roadmap", 1],
                                                                                ["v2.0-roadmap", 20]], "answerable": True}
    samples, truths = read_questions(tmp_path / "s.parquet")
    assert samples[0].instructions == TagFormat.corpus_instructions and samples[0].doc_id is None
    assert written_for(samples) == ("tags", False)
    assert dataset.default_scope("slidevqa") == dataset.default_scope("vidoseek") == "corpus"
    assert {dataset.default_scope(name) for name in ("mmlongbench-doc", "mmdocir", "longdocurl", None)} == {"document"}


def test_own_questions_keep_their_documents_and_the_scope_flag_overrides(tmp_path, capsys):
    from .test_dataset import question

    src = write_jsonl(tmp_path / "q.jsonl", [question("a", "report.pdf", [3]), question("b", "manual.pdf", [1, 2])])
    assert cli_main(["convert-dataset", str(src), "--out", str(tmp_path / "own.parquet")]) == 0
    assert [r["doc_id"] for r in rows_of(tmp_path / "own.parquet")] == ["report", "manual"]
    assert "scope" not in capsys.readouterr().out  # today's summary, unchanged
    assert cli_main(["convert-dataset", str(src), "--out", str(tmp_path / "c.parquet"), "--scope", "corpus",
                     "--action-format", "tool_call"]) == 0
    assert "scope: corpus" in capsys.readouterr().out
    rows = rows_of(tmp_path / "c.parquet")
    assert [r["gold_pages"] for r in rows] == [[["report", 3]], [["manual", 1], ["manual", 2]]]
    samples, _ = read_questions(tmp_path / "c.parquet")
    assert samples[0].instructions == ToolCallFormat.corpus_instructions
    with pytest.raises(SystemExit):
        cli_main(["convert-dataset", str(src), "--out", str(tmp_path / "x.parquet"), "--scope", "everything"])


def test_a_corpus_split_by_document_keeps_each_documents_questions_together(tmp_path):
    from .test_dataset import question

    rows = [question(f"q{i}", f"doc{i % 7}.pdf", [1]) for i in range(60)]
    src = write_jsonl(tmp_path / "q.jsonl", rows)
    dataset.convert_dataset(src, tmp_path / "t.parquet", scope="corpus", val_out=tmp_path / "v.parquet",
                            val_fraction=0.4, split_of="document")
    docs = lambda path: {r["gold_pages"][0][0] for r in rows_of(path)}  # noqa: E731
    assert docs(tmp_path / "t.parquet") and docs(tmp_path / "v.parquet")
    assert not docs(tmp_path / "t.parquet") & docs(tmp_path / "v.parquet")


def test_corpus_rows_in_verl_layout_have_a_null_document(tmp_path):
    from .test_dataset import question

    src = write_jsonl(tmp_path / "q.jsonl", [question("a", "report.pdf", [3])])
    dataset.convert_dataset(src, tmp_path / "v.parquet", scope="corpus", layout="verl")
    row = pq.read_table(tmp_path / "v.parquet").to_pylist()[0]
    assert "doc_id" in row and row["doc_id"] is None
    assert json.loads(row["reward_model"]["ground_truth"])["gold_pages"] == [["report", 3]]
