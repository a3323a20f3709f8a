"""`vrag-rollout evaluate` as a new user meets it, without rolling anything out: the tiny model by
default (`--family`, like `rollout`), its grammar on by default and a warning without it, the
model recorded by its absolute path, `--n`/`--temperature` for pass@k, and the progress lines
(what a resume has left, a line per batch)."""

from __future__ import annotations

import json

import pytest

from vrag_rollout.cli import build_parser, main
from vrag_rollout.devkit.evaluate_job import run_evaluation
from vrag_rollout.evaluation.progress import batch_line, plan_line, resume_line
from vrag_rollout.evaluation.protocol import Protocol


def test_progress_lines_say_what_is_done_and_what_is_left():
    assert resume_line(3, 5) == "resuming: 3 of 5 questions done, 2 to go"
    assert plan_line(2, 1, 8) == "evaluating 2 questions in 1 batch of up to 8"
    assert plan_line(5, 4, 2) == "evaluating 5 questions (4 samples each) in 3 batches of up to 2"
    # the pace of this run's batches, not of the questions a resume found done
    assert batch_line(1, 2, done=4, total=6, done_before=2, elapsed=40.0) == (
        "batch 1 of 2: 4 of 6 questions done (40 s, about 40 s to go)")
    assert batch_line(2, 2, done=6, total=6, done_before=2, elapsed=75.4) == (
        "batch 2 of 2: 6 of 6 questions done (75 s)")


def test_evaluate_takes_the_tiny_model_by_default_and_sampling_for_pass_at_k():
    args = build_parser().parse_args(["evaluate", "--data", "q.parquet", "--index", "i", "--out", "o"])
    # unset, the protocol's own value holds (`--protocol`, default own: one greedy sample)
    assert (args.model, args.family, args.grammar, args.n, args.temperature) == (None, None, None, None, None)
    assert args.protocol == "own"
    args = build_parser().parse_args(["evaluate", "--data", "q.parquet", "--index", "i", "--out", "o", "--family",
                                      "qwen2.5-vl", "--no-grammar", "--n", "4", "--temperature", "0.7"])
    assert (args.family, args.grammar, args.n, args.temperature) == ("qwen2.5-vl", False, 4, 0.7)


@pytest.mark.parametrize("flags, says", [(["--n", "2"], "--temperature"), (["--n", "0"], "--n"),
                                         (["--temperature", "-1"], "--temperature"),
                                         (["--batch-size", "0"], "--batch-size")])
def test_a_bad_sampling_value_is_one_line(flags, says, tmp_path, capsys):
    assert main(["evaluate", "--data", str(tmp_path / "q.parquet"), "--index", str(tmp_path), "--out",
                 str(tmp_path / "o"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and says in err and "usage:" not in err, err


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from tests.rollout.test_converted_sets_roll_out import written_in
    from vrag_rollout.data import dataset
    from vrag_rollout.devkit.demo import cache_dir, prepare_index

    index, work = prepare_index(cache_dir()), tmp_path_factory.mktemp("data")
    data = work / "mmlb.parquet"
    dataset.convert_dataset(written_in("mmlongbench-doc", work), data, index_dir=index, source_format="mmlongbench-doc")
    return data, index


def header_of(out) -> dict:
    return json.loads((out / "results.jsonl").read_text().splitlines()[0])["header"]


def test_without_a_model_the_tiny_model_runs_with_its_grammar(converted, tiny_model_dir, tmp_path, capsys):
    data, index = converted
    run = dict(data=data, index=index, protocol=Protocol(max_turns=2), limit=0, progress=False)
    run_evaluation(tmp_path / "default", **run)  # the header only: no question rolled out
    header = header_of(tmp_path / "default")
    assert header["model"] == str(tiny_model_dir.resolve()) and header["grammar"] is True
    assert "will not act" not in capsys.readouterr().err
    run_evaluation(tmp_path / "bare", grammar=False, **run)
    assert header_of(tmp_path / "bare")["grammar"] is False
    assert "the tiny random model will not act without --grammar" in capsys.readouterr().err


def test_a_checkpoint_is_recorded_by_its_absolute_path(converted, tiny_model_dir, tmp_path, monkeypatch):
    data, index = converted
    monkeypatch.chdir(tiny_model_dir.parent)
    run_evaluation(tmp_path / "named", data=data, index=index, model=tiny_model_dir.name, protocol=Protocol(),
                   limit=0, progress=False)
    header = header_of(tmp_path / "named")
    assert header["model"] == str(tiny_model_dir.resolve()) and header["grammar"] is False  # a checkpoint's own


def test_naming_two_retrievers_says_pass_only_one(converted, tmp_path):
    from vrag_rollout.devkit.job_checks import JobInputError

    data, index = converted
    with pytest.raises(JobInputError, match="only one"):
        run_evaluation(tmp_path / "o", data=data, index=index, retriever_url="http://127.0.0.1:1",
                       protocol=Protocol(), limit=0, progress=False)
