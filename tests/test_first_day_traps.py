"""A new user's input traps (issue 48, item 7), through the command line in-process: each wrong
input gets one clear message naming the fix, and exit code 2, before anything starts."""

from __future__ import annotations

import json

import pytest

from vrag_rollout.cli import main

QUESTION = {"uid": "q1", "query": "Where is the muster point?", "reference_answer": "car park",
            "meta_info": {"file_name": "safety_manual.pdf", "reference_page": [4]}}


def refused(argv: list[str], capsys) -> str:
    """The one line a refused command prints (exit code 2, no usage tail, the prefix once)."""
    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    said = capsys.readouterr().err
    assert code == 2 and said.count("error:") == 1 and "usage:" not in said, said
    return said


def test_questions_given_to_rollout_unconverted_are_pointed_at_a_new_parquet(tmp_path, capsys):
    questions = tmp_path / "my_questions.json"
    questions.write_text(json.dumps([QUESTION]))
    said = refused(["rollout", "--data", str(questions), "--out", str(tmp_path / "x.pt"), "--fixtures", "f.json"], capsys)
    parquet = tmp_path / "my_questions.parquet"
    assert f"convert-dataset {questions} --out {parquet}" in said and f"--data {parquet}" in said
    assert f"--out {questions}" not in said  # never the advice to overwrite the questions


def test_both_retrievers_named_is_refused_as_such(tmp_path, capsys):
    from vrag_rollout.data.dataset import convert_dataset

    questions = tmp_path / "q.json"
    questions.write_text(json.dumps([QUESTION]))
    convert_dataset(questions, tmp_path / "q.parquet")
    said = refused(["rollout", "--data", str(tmp_path / "q.parquet"), "--out", str(tmp_path / "x.pt"),
                    "--index", str(tmp_path), "--retriever-url", "http://127.0.0.1:9"], capsys)
    assert "pass only one of --index" in said and "name the retriever" not in said


def test_the_credit_task_with_your_own_data_is_refused(tmp_path, capsys):
    """`--task two-pages` asks its own questions: with --data it would silently ignore the file."""
    from vrag_rollout.data.dataset import convert_dataset

    questions = tmp_path / "q.json"
    questions.write_text(json.dumps([QUESTION]))
    convert_dataset(questions, tmp_path / "q.parquet")
    said = refused(["learn", "--task", "two-pages", "--data", str(tmp_path / "q.parquet"), "--out",
                    str(tmp_path / "run")], capsys)
    assert "--task two-pages asks its own questions" in said


@pytest.mark.parametrize("kind, head, fragment", [
    ("pdf", b"%PDF-1.4\n\xff\xfe\x00 binary", "this is a PDF, a document, not a questions file"),
    ("parquet", b"PAR1\x15\x04\xff binary", "already a converted dataset"),
    ("latin1", '[{"query": "caf\u00e9"}]'.encode("latin-1"), "not UTF-8 text"),
])
def test_a_file_that_is_not_questions_says_what_it_is(kind, head, fragment, tmp_path, capsys):
    source = tmp_path / f"questions.{kind}"
    source.write_bytes(head)
    code = main(["convert-dataset", str(source), "--out", str(tmp_path / "out.parquet")])
    said = capsys.readouterr().err
    assert code == 2 and fragment in said and "codec" not in said
    assert not (tmp_path / "out.parquet").exists()


def test_a_model_directory_that_cannot_run_is_one_line_with_the_prefix_once(tmp_path, capsys):
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps([QUESTION]))
    said = refused(["rollout", "--data", str(questions), "--out", str(tmp_path / "x.pt"), "--fixtures", "f.json",
                    "--model", str(tmp_path / "no_model")], capsys)
    assert said.startswith("vrag-rollout rollout: error: --model") and "rollout: error: rollout:" not in said


def test_open_domain_questions_convert_in_corpus_scope_only(tmp_path, capsys):
    """Issue 48, item 5: a question with no known document searches the whole index, its
    retrieval unscored; in document scope it is refused naming --scope corpus."""
    import pandas as pd

    source = tmp_path / "open.json"
    source.write_text(json.dumps([{"uid": "o1", "query": "What is the capital of France?", "reference_answer": "Paris"},
                                  QUESTION]))
    assert main(["convert-dataset", str(source), "--out", str(tmp_path / "doc.parquet")]) == 2
    assert "converts with --scope corpus only" in capsys.readouterr().err
    assert main(["convert-dataset", str(source), "--out", str(tmp_path / "open.parquet"), "--scope", "corpus"]) == 0
    rows = pd.read_parquet(tmp_path / "open.parquet")
    assert rows["doc_id"].isna().all()
    assert json.loads(rows["answer"][0]) == {"answer": "Paris", "doc_id": None, "gold_pages": []}
    assert json.loads(rows["answer"][1])["gold_pages"] == [["safety_manual", 4]]


@pytest.mark.parametrize("action_format", ["tags", "tool_call"])
def test_in_corpus_scope_the_acting_grammars_first_turn_searches(action_format):
    """Issue 48, item 5: a fetch before any page is shown always fails in corpus scope ("search
    first"), so the grammar a tiny model acts under opens with a search there."""
    from vrag_rollout.devkit.demo import FREE_QUERY, acting_grammar

    corpus = acting_grammar(action_format, FREE_QUERY, 6, corpus=True)
    document = acting_grammar(action_format, FREE_QUERY, 6)
    assert "search" in corpus["first_turn_action_regex"] and "fetch" not in corpus["first_turn_action_regex"]
    assert "fetch" in document["first_turn_action_regex"] and "fetch" in corpus["action_regex"]


def test_bad_samples_go_under_the_runs_output_by_default(tmp_path):
    """Issue 48, item 9: `guard_samples_dir` defaults to "auto", `guard_bad_samples/` under the
    run's own output; a guard built without a run output saves none rather than litter the
    directory a trainer was started from."""
    from vrag_rollout.config import AgentRolloutConfig, guard_samples_under
    from vrag_rollout.devkit.tiny_model import build_tiny_model, default_model_dir
    from vrag_rollout.verify.guard import LiveGuard

    assert AgentRolloutConfig().guard_samples_dir == "auto"
    assert guard_samples_under("auto", "checkpoints/p/e") == "checkpoints/p/e/guard_bad_samples"
    assert guard_samples_under("auto", None) is None and guard_samples_under("/x/y", "run") == "/x/y"
    live = LiveGuard.from_config(build_tiny_model(default_model_dir("qwen2-vl"), "qwen2-vl"), AgentRolloutConfig())
    assert live.samples is None


def test_rollout_takes_rows_from_an_offset(tmp_path, capsys):
    """Issue 48, item 10: `--offset` skips the first rows (`--batch-size` is how many); an offset
    past the file's end is one line, exit 2."""
    from vrag_rollout.data.dataset import convert_dataset
    from vrag_rollout.data.questions import read_questions

    rows = [{**QUESTION, "uid": f"q{i}", "query": f"Question number {i}?"} for i in range(5)]
    (tmp_path / "q.json").write_text(json.dumps(rows))
    convert_dataset(tmp_path / "q.json", tmp_path / "q.parquet")
    samples, _ = read_questions(tmp_path / "q.parquet", 2, offset=3)
    assert [s.question for s in samples] == ["Question number 3?", "Question number 4?"]
    said = refused(["rollout", "--data", str(tmp_path / "q.parquet"), "--out", str(tmp_path / "x.pt"),
                    "--fixtures", "f.json", "--offset", "5"], capsys)
    assert "no questions from row 5: the file has 5" in said


def test_a_checkpoint_restores_the_weights_and_the_optimizer(tmp_path):
    """Issue 48, item 10: what `learn --resume` reads back is what the run saved."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from vrag_rollout.devkit.learn_checkpoints import latest_checkpoint, restore, save_checkpoint
    from vrag_rollout.devkit.tiny_model import build_tiny_model, default_model_dir

    model_dir = build_tiny_model(default_model_dir("qwen2-vl"), "qwen2-vl")
    trained = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-3)
    sum(p.float().pow(2).sum() for p in trained.parameters()).backward()
    optimizer.step()  # weights moved, optimizer state filled
    save_checkpoint(tmp_path, 7, trained, optimizer, AutoProcessor.from_pretrained(model_dir))
    fresh = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    assert not all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), trained.state_dict().values()))
    assert restore(latest_checkpoint(tmp_path), fresh, fresh_optimizer) == 7
    for name, value in trained.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name
    restored = fresh_optimizer.state_dict()["state"]
    assert set(restored) == set(optimizer.state_dict()["state"]) and restored
    assert not list(tmp_path.glob("checkpoints/*.partial"))


def test_a_mistyped_output_path_is_refused_not_created(tmp_path, capsys):
    """Issue 48, item 7: `--out /no/such/dir/x.parquet` created `/no`; one missing directory (a
    fresh clone's `artifacts/`) is still made."""
    source = tmp_path / "q.json"
    source.write_text(json.dumps([QUESTION]))
    deep = tmp_path / "no" / "such" / "dir" / "x.parquet"
    assert main(["convert-dataset", str(source), "--out", str(deep)]) == 2
    said = capsys.readouterr().err
    assert f"{tmp_path / 'no'} does not exist" in said and not (tmp_path / "no").exists()
    assert main(["convert-dataset", str(source), "--out", str(tmp_path / "new" / "x.parquet")]) == 0
    said = refused(["rollout", "--data", str(tmp_path / "new" / "x.parquet"), "--fixtures", "f.json",
                    "--out", str(tmp_path / "no" / "such" / "x.pt")], capsys)
    assert "does not exist (a mistyped path?)" in said and not (tmp_path / "no").exists()
