"""No expected user error prints a traceback: every subcommand, driven with a retriever that is
down, a document the retriever lacks, a file of the wrong type and a path that does not exist,
exits 2 with one line that says what is wrong, before any model or engine loads (issue 33)."""

from __future__ import annotations

import socket
import time

import pytest

from tests.own_documents import write_own_data

pytestmark = pytest.mark.process  # servers or subprocesses (tests/conftest.py)


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    data = write_own_data(root)
    (root / "notes.txt").write_text("not a batch, a parquet, a fixture file or a question file\n")
    return data


@pytest.fixture(scope="module")
def down_url():
    """The URL of a port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def own_server(own):
    """A retriever serving the user's documents (the sample corpus's are not among them)."""
    from retriever_server.api.testing import serve_in_thread

    with serve_in_thread(own.index) as url:
        yield url


def _cases(own, down_url, own_server):
    notes = own.questions.parent / "notes.txt"
    gone = own.questions.parent / "gone"
    data = ["--data", str(own.parquet)]
    return {
        # a retriever that is down
        "demo/down": (["demo", "--retriever-url", down_url], "no answer"),
        "rollout/down": (["rollout", *data, "--retriever-url", down_url], "no answer"),
        "learn/down": (["learn", "--retriever-url", down_url], "no answer"),
        "learn-data/down": (["learn", *data, "--retriever-url", down_url], "no answer"),
        "record-fixtures/down": (["record-fixtures", "--out", str(gone / "f.json"), "--retriever-url", down_url],
                                 "no answer"),
        "record-fixtures-data/down": (["record-fixtures", *data, "--out", str(gone / "f.json"),
                                       "--retriever-url", down_url], "no answer"),
        # a document the retriever lacks
        "demo/missing-document": (["demo", "--retriever-url", own_server], "does not hold 3 document(s)"),
        "rollout/missing-document": (["rollout", *data, "--index", str(own.partial_index)],
                                     "does not hold 1 document(s) of this batch: garden_plan"),
        "learn/missing-document": (["learn", *data, "--index", str(own.partial_index)],
                                   "does not hold 1 document(s) of this batch: garden_plan"),
        "learn-sample-index/missing-document": (["learn", *data], "without --index, learn serves the sample"),
        "record-fixtures/missing-document": (["record-fixtures", *data, "--out", str(gone / "f.json"),
                                              "--index", str(own.partial_index)], "garden_plan"),
        # a file of the wrong type
        "demo/wrong-type": (["demo", "--fixtures", str(notes)], "not a fixture file"),
        "rollout/wrong-type": (["rollout", "--data", str(own.questions), "--index", str(own.index)],
                               "convert-dataset"),
        "learn/wrong-type": (["learn", "--data", str(own.questions)], "not a parquet file"),
        "record-fixtures/wrong-type": (["record-fixtures", "--data", str(notes), "--out", str(gone / "f.json"),
                                        "--index", str(own.index)], "not a readable parquet file"),
        "check/wrong-type": (["check", str(notes)], "is not a saved rollout batch"),
        "view/wrong-type": (["view", str(notes), "-o", str(gone / "v.html")], "is not a saved rollout batch"),
        "convert-dataset/wrong-type": (["convert-dataset", str(notes), "--out", str(gone / "q.parquet")],
                                       "not valid JSON"),
        "convert-dataset-index/wrong-type": (["convert-dataset", str(own.questions), "--out", str(gone / "q.parquet"),
                                              "--index", str(notes)], "not a directory"),
        # a path that does not exist
        "demo/wrong-path": (["demo", "--model", str(gone)], "not a local model directory"),
        "rollout/wrong-path": (["rollout", "--data", str(gone / "q.parquet"), "--index", str(own.index)],
                               "no such file"),
        "rollout-index/wrong-path": (["rollout", *data, "--index", str(gone)], "does not exist"),
        "learn/wrong-path": (["learn", "--index", str(gone)], "not a retriever index"),
        "record-fixtures/wrong-path": (["record-fixtures", *data, "--out", str(gone / "f.json"),
                                        "--index", str(gone)], "does not exist"),
        "check/wrong-path": (["check", str(gone / "b.pt")], "no such file"),
        "view/wrong-path": (["view", str(gone / "b.pt"), "-o", str(gone / "v.html")], "no such file"),
        "convert-dataset/wrong-path": (["convert-dataset", str(gone / "q.json"), "--out", str(gone / "q.parquet")],
                                       "No such file"),
        "build-tiny-model/wrong-path": (["build-tiny-model", "/proc/no/such/dir"], "cannot build the model there"),
        # evaluate: the same mistakes, and a checkpoint that is not one
        "evaluate/down": (["evaluate", *data, "--model", str(gone), "--out", str(gone / "e"),
                           "--retriever-url", down_url], "no answer"),
        "evaluate/missing-document": (["evaluate", *data, "--model", str(gone), "--out", str(gone / "e"),
                                       "--index", str(own.partial_index)],
                                      "does not hold 1 document(s) of this batch: garden_plan"),
        "evaluate/wrong-type": (["evaluate", "--data", str(own.questions), "--model", str(gone), "--out",
                                 str(gone / "e"), "--index", str(own.index)], "not a readable parquet file"),
        "evaluate/wrong-path": (["evaluate", "--data", str(gone / "q.parquet"), "--model", str(gone), "--out",
                                 str(gone / "e"), "--index", str(own.index)], "no such file"),
        "evaluate-model/wrong-path": (["evaluate", *data, "--model", str(gone), "--out", str(gone / "e"),
                                       "--index", str(own.index)], "not a local model directory"),
        # evaluate-retriever: the index alone, the same file mistakes
        "evaluate-retriever/wrong-type": (["evaluate-retriever", "--data", str(notes), "--index", str(own.index),
                                           "--out", str(gone / "r")], "not a readable parquet file"),
        "evaluate-retriever/wrong-path": (["evaluate-retriever", "--data", str(gone / "q.parquet"), "--index",
                                           str(own.index), "--out", str(gone / "r")], "no such file"),
    }


CASE_NAMES = ["demo/down", "rollout/down", "learn/down", "learn-data/down", "record-fixtures/down",
              "record-fixtures-data/down", "demo/missing-document", "rollout/missing-document",
              "learn/missing-document", "learn-sample-index/missing-document", "record-fixtures/missing-document",
              "demo/wrong-type", "rollout/wrong-type", "learn/wrong-type", "record-fixtures/wrong-type",
              "check/wrong-type", "view/wrong-type", "convert-dataset/wrong-type", "convert-dataset-index/wrong-type",
              "demo/wrong-path", "rollout/wrong-path", "rollout-index/wrong-path", "learn/wrong-path",
              "record-fixtures/wrong-path", "check/wrong-path", "view/wrong-path", "convert-dataset/wrong-path",
              "build-tiny-model/wrong-path",
              "evaluate/down", "evaluate/missing-document", "evaluate/wrong-type", "evaluate/wrong-path",
              "evaluate-model/wrong-path", "evaluate-retriever/wrong-type", "evaluate-retriever/wrong-path"]


def _is_usage_line(line: str) -> bool:
    # argparse's usage block (a usage error prints the subcommand's usage above its one error line)
    return line.startswith("usage: ") or line.startswith(" ")


@pytest.mark.parametrize("case", CASE_NAMES)
def test_an_expected_user_error_is_one_line_and_exit_2(case, own, down_url, own_server, capsys, monkeypatch):
    from vrag_rollout.cli import main
    from vrag_rollout.rollout.agent import vLLMRolloutAgent

    def no_engine(*args, **kwargs):
        raise AssertionError("the error was found only after the rollout (and its engine) started")

    monkeypatch.setattr(vLLMRolloutAgent, "__init__", no_engine)
    argv, expected = _cases(own, down_url, own_server)[case]
    started = time.monotonic()
    try:
        code = main(argv)
    except SystemExit as exit_info:  # argparse's usage errors
        code = exit_info.code
    seconds = time.monotonic() - started
    out, err = capsys.readouterr()
    assert code == 2, (case, out[-800:], err[-800:])
    assert "Traceback" not in out + err
    said = [line for line in err.splitlines() if line.strip() and not _is_usage_line(line)]
    if argv[0] == "check":  # check's report: one human line on stdout, then its JSON line
        said = [line for line in out.splitlines() if line.strip() and not line.startswith("{")]
    assert len(said) == 1, (case, said)
    assert expected in said[0], (case, said[0])
    assert seconds < 30, (case, seconds)  # found before any model loads


def test_every_subcommand_is_driven(own, down_url, own_server):
    from vrag_rollout.cli import build_parser, subcommand_parser

    import argparse

    from vrag_rollout.cli import build_parser

    cases = _cases(own, down_url, own_server)
    assert set(cases) == set(CASE_NAMES)
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(commands) == {argv[0] for argv, _expected in cases.values()}


def test_warn_goes_on_past_a_missing_document_and_off_skips_the_check(own, capsys):
    from vrag_rollout.devkit.job_checks import JobInputError, RetrieverSource, check_retriever

    source = RetrieverSource(index=own.partial_index)
    docs = ["garden_plan", "bike_manual"]
    with pytest.raises(JobInputError, match="garden_plan.*--retriever-preflight warn goes on anyway"):
        check_retriever(source, docs, mode="fail")
    check_retriever(source, docs, mode="warn")
    assert capsys.readouterr().err.startswith("warning: retriever preflight: --index")
    check_retriever(source, docs, mode="off")
    assert capsys.readouterr().err == ""
    with pytest.raises(JobInputError, match="does not exist"):  # an index that is not one fails in every mode
        check_retriever(RetrieverSource(index=own.index.parent / "gone"), docs, mode="off")


def test_page_counts_the_data_recorded_are_compared_with_the_index(own):
    from vrag_rollout.devkit.job_checks import RetrieverSource, retriever_problem

    source = RetrieverSource(index=own.index)
    assert retriever_problem(source, ["garden_plan", "bike_manual"], [3, 2]) is None
    problem = retriever_problem(source, ["garden_plan", "bike_manual"], [4, 2])
    assert problem is not None and "garden_plan (4 in the data, 3 served)" in problem
