"""`vrag-retriever`'s expected user errors exit 2 with one line, as `vrag-rollout`'s do (issue 48,
item 7): `vrag-retriever COMMAND: error: ...`, no traceback, the prefix once, no usage tail for a
value that argparse accepted. Run in this process (main(argv), SystemExit caught)."""

from __future__ import annotations

from pathlib import Path

import pytest

from retriever_server.cli import DESCRIPTION, build_parser, main


def run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code


def _cases(tmp: Path, sample_pdfs, sample_index) -> dict[str, tuple[list[str], str]]:
    (tmp / "not_json").mkdir()
    (tmp / "not_json" / "manifest.json").write_text("{")
    (tmp / "other_format").mkdir()
    (tmp / "other_format" / "manifest.json").write_text('{"format": "something else"}')
    (tmp / "no_fields").mkdir()
    (tmp / "no_fields" / "manifest.json").write_text('{"format": "vrag-retriever-index", "format_version": 1}')
    (tmp / "notes.txt").write_text("a file, not a folder\n")
    pdf = str(sample_pdfs[2])
    out = ["--out", str(tmp / "idx")]
    return {
        "index/missing-source": (["index", str(tmp / "nothing.pdf"), *out], "no such file or folder"),
        "index/not-a-pdf": (["index", str(tmp / "notes.txt"), *out], "not a PDF"),
        "index/out-not-an-index": (["index", pdf, "--out", str(tmp)], "is not an index"),
        "index/jpeg-quality": (["index", pdf, *out, "--jpeg-quality", "200"], "--jpeg-quality must be in 1..95"),
        "index/dpi": (["index", pdf, *out, "--dpi", "5"], "--dpi must be in 18..600"),
        "index/pixels": (["index", pdf, *out, "--min-pixels", "10"], "--min-pixels"),
        "index/backend-without-encoder": (["index", pdf, *out, "--backend", "qdrant"], "needs --encoder"),
        "index/out-under-a-file": (["index", pdf, "--out", str(tmp / "notes.txt" / "idx")], "notes.txt"),
        "serve/missing-index": (["serve", "--index", str(tmp / "none")], "does not exist"),
        "serve/not-json": (["serve", "--index", str(tmp / "not_json")], "manifest.json is not valid JSON"),
        "serve/other-format": (["serve", "--index", str(tmp / "other_format")], "not a vrag-retriever index"),
        "serve/no-fields": (["serve", "--index", str(tmp / "no_fields")], "lacks"),
        "serve/public-bind": (["serve", "--index", str(sample_index), "--host", "0.0.0.0"], "refusing to bind"),
        "serve/bad-limit": (["serve", "--index", str(sample_index), "--max-in-flight", "0"], "--max-in-flight must be at least 1, got 0"),
        "sample-corpus/into-a-file": (["sample-corpus", str(tmp / "notes.txt")], "notes.txt"),
    }


CASES = ["index/missing-source", "index/not-a-pdf", "index/out-not-an-index", "index/jpeg-quality", "index/dpi",
         "index/pixels", "index/backend-without-encoder", "index/out-under-a-file", "serve/missing-index",
         "serve/not-json", "serve/other-format", "serve/no-fields", "serve/public-bind", "serve/bad-limit",
         "sample-corpus/into-a-file"]


@pytest.mark.parametrize("case", CASES)
def test_a_user_error_is_one_line_and_exit_2(case, tmp_path, sample_pdfs, sample_index, capsys):
    argv, said = _cases(tmp_path, sample_pdfs, sample_index)[case]
    assert run(argv) == 2, case
    err = capsys.readouterr().err
    command = argv[0]
    assert err.startswith(f"vrag-retriever {command}: error: "), err
    assert len(err.strip().splitlines()) == 1, err  # one line: no traceback, no usage tail
    assert err.count("error:") == 1 and err.count(f"{command}:") == 1, err  # the prefix once
    assert said in err, err


def test_every_case_is_listed(tmp_path, sample_pdfs, sample_index):
    assert sorted(CASES) == sorted(_cases(tmp_path, sample_pdfs, sample_index))


def test_a_usage_error_is_still_argparse_s_with_exit_2(capsys):
    assert run(["index", "x.pdf"]) == 2  # no --out
    err = capsys.readouterr().err
    assert err.startswith("usage: vrag-retriever index") and "the following arguments are required: --out" in err


def test_help_says_it_searches_the_corpus_or_one_document(capsys):
    """Issue 48, item 9: no longer 'inside one document' only."""
    assert "inside one document per query" not in DESCRIPTION
    assert "whole corpus" in DESCRIPTION
    assert run(["--help"]) == 0
    assert "whole corpus" in capsys.readouterr().out
    assert "one document" in build_parser().description
    intro = (Path(__file__).resolve().parents[2] / "docs" / "retriever.md").read_text().split("\n\n")[1]
    assert "the whole corpus" in intro and "inside one document" not in intro, intro
