"""`vrag-rollout evaluate` end to end on the real engine: questions about the sample corpus in two
public sets' layouts (ViDoSeek: corpus scope by default; MMLongBench-Doc: document scope), each
evaluated in both scopes against the real retriever with the tiny model; every question gets its
record and the report its table; the retrieval recall of a saved episode equals a count made
here from the saved batch alone; an interrupted evaluation of your own questions (converted
without `--from`: the `questions` benchmark, two samples per question) resumes, saying what it
found; another protocol, and a set's file, are refused."""

from __future__ import annotations

import json

import pytest

from tests.rollout.test_converted_sets_roll_out import facts, written_in
from vrag_rollout.data import dataset
from vrag_rollout.devkit.evaluate_job import run_evaluation
from vrag_rollout.devkit.job_checks import JobInputError
from vrag_rollout.evaluation.protocol import Protocol
from vrag_rollout.verify.saved_batch import load_rollout


@pytest.fixture(scope="module")
def sample_index():
    from vrag_rollout.devkit.demo import cache_dir, prepare_index

    return prepare_index(cache_dir())


def converted(layout: str, tmp_path, index) -> tuple:
    out = tmp_path / f"{layout}.parquet"
    report = dataset.convert_dataset(written_in(layout, tmp_path), out, index_dir=index, source_format=layout)
    return out, report.scope


def own_questions(tmp_path, index):
    """Your own questions (no `--from`), in corpus scope: one about a sample-corpus fact, with its
    gold page, and an open-domain one the corpus cannot answer (no document, no gold page)."""
    fact, doc, page = facts()[0]
    rows = [{"uid": "fact", "query": f"Which page covers {fact}?", "reference_answer": str(page),
             "meta_info": {"file_name": f"{doc}.pdf", "reference_page": [page]}},
            {"uid": "open", "query": "How many moons does Neptune have?", "reference_answer": "Not answerable"}]
    source, out = tmp_path / "my_questions.json", tmp_path / "my_questions.parquet"
    source.write_text(json.dumps(rows))
    dataset.convert_dataset(source, out, index_dir=index, scope="corpus")
    return out


def records_of(out) -> list[dict]:
    lines = (out / "results.jsonl").read_text().splitlines()
    assert "header" in json.loads(lines[0])
    return [json.loads(line) for line in lines[1:]]


def hand_recall(out, record: dict) -> float:
    """The record's recall counted from its saved batch: the gold (document, page) pairs among the
    pages the saved episode was shown, over all gold pages."""
    view = out / record["episode"]["batch"]
    saved = load_rollout(view.with_suffix(".pt"))
    row = record["episode"]["row"]
    shown = {page for turn in saved.columns["page_ids"][row] for page in turn}
    truth = json.loads(saved.columns["ground_truth"][row])
    gold = {f"{g[0]}_{g[1]}" if isinstance(g, list) else f"{truth['doc_id']}_{g}" for g in truth["gold_pages"]}
    return len(shown & gold) / len(gold)


@pytest.mark.parametrize("layout", ["vidoseek", "mmlongbench-doc"])
def test_evaluate_two_sets_in_both_scopes(layout, tmp_path, sample_index, tiny_model_dir, tiny_llm):
    data, converted_scope = converted(layout, tmp_path, sample_index)
    assert converted_scope == ("corpus" if layout == "vidoseek" else "document")
    other = "document" if converted_scope == "corpus" else "corpus"
    for scope in (None, other):
        out = tmp_path / f"eval-{scope}"
        report = run_evaluation(out, data=data, model=str(tiny_model_dir), index=sample_index, grammar=True,
                                protocol=Protocol(scope=scope, max_turns=3, response_length=512),
                                batch_size=4, llm=tiny_llm, progress=False)
        records = records_of(out)
        assert len(records) == len(facts()) and {r["set"] for r in records} == {layout}
        assert {r["scope"] for r in records} == {scope or converted_scope}
        bench = report["benchmarks"][layout]
        assert bench["questions"] == len(facts()) and bench["counted"] == len(facts())
        assert 0.0 <= bench["scores"]["accuracy"] <= 1.0
        written = json.loads((out / "report.json").read_text())["header"]
        assert written["protocol"]["scope"] == scope and written["index"]["documents"] == 3
        markdown = (out / "report.md").read_text()
        assert f"## {layout}" in markdown and "`max_turns`: 3" in markdown and "episodes/batch-0001.html" in markdown
        for record in records:  # the recall the report averages, against a count from the saved batch
            assert record["retrieval"]["recall"] == pytest.approx(hand_recall(out, record)), record
        if (scope or converted_scope) == "document":  # its own document's pages: some gold page was shown
            assert any(record["retrieval"]["recall"] > 0 for record in records), records
        assert bench["retrieval"]["recall"] == pytest.approx(
            sum(r["retrieval"]["recall"] for r in records) / len(records))
        if layout == "mmlongbench-doc":  # its own categories reach the report
            assert "answer_format" in bench["categories"]


def test_an_interrupted_evaluation_of_your_own_questions_resumes_and_another_protocol_is_refused(
        tmp_path, sample_index, tiny_model_dir, tiny_llm, capsys):
    """Your own questions, two samples each (pass@k): scored as the `questions` benchmark by the
    project's rules; a resume says what it found; another n, or a set's file, is refused."""
    data = own_questions(tmp_path, sample_index)
    out, protocol = tmp_path / "eval", Protocol(max_turns=2, response_length=512, n=2, temperature=1.0)
    run = dict(data=data, model=str(tiny_model_dir), index=sample_index, grammar=True, batch_size=1, llm=tiny_llm)
    run_evaluation(out, protocol=protocol, limit=1, **run)  # stopped after the first question
    said = capsys.readouterr().out
    assert "evaluating 1 question (2 samples each) in 1 batch of up to 1" in said
    assert "batch 1 of 1: 1 of 1 questions done" in said and "resuming" not in said
    first = records_of(out)
    assert [(r["question_id"], r["sample"]) for r in first] == [(first[0]["question_id"], 0),
                                                                (first[0]["question_id"], 1)]
    report = run_evaluation(out, protocol=protocol, **run)
    said = capsys.readouterr().out
    assert "resuming: 1 of 2 questions done, 1 to go" in said and "batch 1 of 1: 2 of 2 questions done" in said
    again = records_of(out)
    assert len(again) == 4 and again[:2] == first  # kept, not rolled out again
    assert sorted(p.name for p in (out / "episodes").glob("*.pt")) == ["batch-0001.pt", "batch-0002.pt"]
    assert report["header"]["sets"] == ["questions"] and set(report["benchmarks"]) == {"questions"}
    bench = report["benchmarks"]["questions"]
    assert (bench["questions"], bench["samples"], bench["pass_at_k"]["k"]) == (2, 4, 2)
    assert bench["pass_at_k"]["scores"]["accuracy"] >= bench["scores"]["accuracy"] and "f1" in bench["scores"]
    # "Not answerable": an unanswerable question, counted (--unanswerable score); no gold page: no retrieval
    unanswerable = [r for r in again if r["question_id"] == "open"]
    assert all(not r["answerable"] and r["counted"] and r["retrieval"] is None for r in unanswerable)
    assert bench["retrieval"]["questions"] == 2  # the fact's two samples only, not the open question's as 0
    markdown = (out / "report.md").read_text()
    assert "pass@2 accuracy" in markdown and "## questions" in markdown and "the project's" in markdown
    with pytest.raises(JobInputError, match="protocol.n"):
        run_evaluation(out, protocol=Protocol(max_turns=2, response_length=512, n=3, temperature=1.0), **run)
    a_set, _ = converted("vidoseek", tmp_path, sample_index)
    with pytest.raises(JobInputError, match="another data, data_sha256, sets"):
        run_evaluation(out, protocol=protocol, **{**run, "data": a_set})


def test_the_vidoseek_judge_is_recorded_beside_the_rule_based_scores(tmp_path, sample_index, tiny_model_dir,
                                                                     tiny_llm):
    from vrag_rollout.evaluation.scorers.vidoseek import JUDGE_PROMPT_VERSION

    data, _ = converted("vidoseek", tmp_path, sample_index)
    out = tmp_path / "judged"
    report = run_evaluation(out, data=data, model=str(tiny_model_dir), index=sample_index, grammar=True,
                            protocol=Protocol(max_turns=2, response_length=512), judge_model=str(tiny_model_dir),
                            llm=tiny_llm, judge_llm=tiny_llm, progress=False)
    judge = report["header"]["protocol"]["judge"]
    assert judge["prompt_version"] == JUDGE_PROMPT_VERSION and "{query}" in judge["prompt"] and judge["fingerprint"]
    for record in records_of(out):
        assert record["judge"] is not None and "judge" in record["metrics"] and "contains" in record["metrics"]
    scores = report["benchmarks"]["vidoseek"]["scores"]
    assert scores["judge_count"] == len(facts()) and "accuracy" in scores


def test_evaluate_says_what_is_missing_in_one_line(tmp_path, capsys):
    from vrag_rollout.cli import main

    assert main(["evaluate", "--data", str(tmp_path / "none.parquet"), "--model", "m", "--out",
                 str(tmp_path / "o"), "--index", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--data" in err and "convert-dataset" in err
