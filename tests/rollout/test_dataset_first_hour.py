"""convert-dataset in a new user's first hour (issue 33, items 5, 6 and 7): what it suggests runs
as printed, questions kept without their document are named where training will fail on them,
and a file in the wrong layout is told which layout it looks like, in one wording, against the
layouts' fields as docs/datasets.md lists them."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from retriever_server.sample_corpus import write_sample_corpus
from vrag_rollout.cli import main as cli_main
from vrag_rollout.data import dataset, sources

from .test_dataset import make_index, question, write_jsonl
from .test_sources import longbench, longdoc, mmdocir_doc, mmdocir_q, slide_qa

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "datasets.md"
VENV_BIN = Path(sys.executable).parent  # where `vrag-retriever` is, for a user with the venv active


# --- item 5: a folder of PDFs passed as --index


def run_as_printed(command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"})


@pytest.mark.process
def test_a_folder_of_pdfs_as_the_index_gets_a_command_that_works_as_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_sample_corpus(tmp_path / "mydocs")
    write_jsonl(tmp_path / "qa.jsonl", [question("q1", "safety_manual.pdf", [2])])
    convert = ["convert-dataset", "qa.jsonl", "--out", "train.parquet"]
    capsys.readouterr()
    assert cli_main([*convert, "--index", "mydocs/"]) == 2
    err = capsys.readouterr().err.strip()
    command = re.search(r"`(vrag-retriever index [^`]+)`", err).group(1)
    # run as printed (a placeholder filled in as its user would: the suggestion should hold none)
    ran = run_as_printed(command.replace("DOCS", "mydocs"), tmp_path)
    assert ran.returncode == 0, (command, ran.stderr)
    assert err.startswith("convert-dataset: --index mydocs: a folder of documents, not a retriever index"), err
    index = shlex.split(command)[-1]  # its --out
    assert command == f"vrag-retriever index mydocs --out {index}" and err.endswith(f"then pass --index {index}")
    assert f"\n{err}\n" in DOC.read_text()  # docs/datasets.md shows this very line
    assert cli_main([*convert, "--index", index]) == 0
    assert "every question's document is in" in capsys.readouterr().out
    # asked again, the folder names the index now beside it
    assert cli_main([*convert, "--index", "mydocs"]) == 2
    assert f"{index} beside it is an index: pass --index {index}" in capsys.readouterr().err


def test_an_empty_folder_as_the_index_gets_a_fresh_out(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    src = write_jsonl(tmp_path / "qa.jsonl", [question("q1")])
    assert cli_main(["convert-dataset", str(src), "--out", str(tmp_path / "t.parquet"), "--index",
                     str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert f"`vrag-retriever index DOCS --out {tmp_path / 'empty-index'}`" in err, err


# --- item 6: questions kept whose document the index lacks


def test_kept_questions_without_their_document_are_named_where_training_fails(tmp_path, capsys):
    index = make_index(tmp_path, {"report": 9})
    rows = [question("a"), question("b", "gone.pdf"), question("c"), question("d", "lost.pdf")]
    src = write_jsonl(tmp_path / "qa.jsonl", rows)
    out, report = tmp_path / "train.parquet", tmp_path / "report.json"
    command = ["convert-dataset", str(src), "--out", str(out), "--index", str(index), "--report", str(report)]
    assert cli_main(command) == 0
    printed = capsys.readouterr()
    warning = printed.err.strip().splitlines()
    assert warning[0] == f"warning: 2 questions kept whose document is not in {index}; training fails on these rows:"
    assert warning[1] == f"  {out} row 2: question b (line 2), document 'gone'"
    assert warning[2] == f"  {out} row 4: question d (line 4), document 'lost'"
    assert "retriever preflight refuses any batch holding one" in warning[3]
    assert "Run this command again with --drop-missing to leave them out" in warning[3]
    assert pq.read_table(out).to_pydict()["question_id"][1] == "b"  # row 2, counted from 1
    kept = json.loads(report.read_text())["missing_documents"]
    assert [(item["file"], item["row"]) for item in kept] == [(str(out), 2), (str(out), 4)]
    # doing what it says: the questions are left out, and nothing is left to warn about
    assert cli_main([*command, "--drop-missing"]) == 0
    printed = capsys.readouterr()
    assert printed.err == "" and "2 questions left out: document not in" in printed.out
    assert pq.read_table(out).to_pydict()["question_id"] == ["a", "c"]


def test_the_docs_warning_is_what_the_command_prints(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    make_index(tmp_path, {"safety_manual": 5}).rename(tmp_path / "mydocs-index")
    write_jsonl(tmp_path / "qa.jsonl", [question("q1", "safety_manual.pdf", [2]),
                                        question("q2", "annual_report_2024.pdf", [1])])
    assert cli_main(["convert-dataset", "qa.jsonl", "--out", "train.parquet", "--index", "mydocs-index"]) == 0
    warning = capsys.readouterr().err.strip()
    assert warning.startswith("warning: ") and f"\n{warning}\n" in DOC.read_text(), warning


def test_the_warning_names_the_validation_file_for_rows_split_there(tmp_path, capsys):
    index = make_index(tmp_path, {"report": 9})
    src = write_jsonl(tmp_path / "qa.jsonl", [question(f"q{k}", "gone.pdf" if k % 2 else "report.pdf")
                                              for k in range(40)])
    out, val = tmp_path / "train.parquet", tmp_path / "val.parquet"
    assert cli_main(["convert-dataset", str(src), "--out", str(out), "--index", str(index),
                     "--val-out", str(val), "--val-fraction", "0.3"]) == 0
    named = re.findall(r"^  (\S+) row (\d+): question (\S+) ", capsys.readouterr().err, re.M)
    assert {file for file, _, _ in named} == {str(out), str(val)}
    for file, row, qid in named:
        assert pq.read_table(file).to_pydict()["question_id"][int(row) - 1] == qid


# --- item 7: the layouts' fields, one wording, and a guess at the layout


def valid_rows() -> dict:
    """One valid row of each layout."""
    return {"vidoseek": question("q1"),
            "slidevqa": slide_qa(101),
            "mmlongbench-doc": longbench("a.pdf", "Which?", "x", "[1]", "Str"),
            "mmdocir": mmdocir_doc("a.pdf", [mmdocir_q("Which?", "x", [0])]),
            "longdocurl": longdoc("q1", "4000001", "y", [1], "String")}


def convert_error(tmp_path: Path, rows: list, source_format: str) -> dataset.DatasetError:
    src = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(dataset.DatasetError) as caught:
        dataset.convert_dataset(src, tmp_path / "t.parquet", source_format=source_format)
    return caught.value


def doc_tables() -> dict:
    """{layout: [(field, required column)]} from docs/datasets.md's table under each layout's heading."""
    tables, layout = {}, None
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            layout = None
        elif line.startswith("### "):
            layout = re.match(r"### `([a-z-]+)`", line).group(1)
            tables[layout] = []
        elif layout and line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            tables[layout].append((cells[0].strip("`"), cells[2]))
    return tables


def without(row: dict, field: str) -> dict:
    """The row without the field (`meta_info.file_name`, `questions[].Q`: in every question)."""
    row = json.loads(json.dumps(row))
    *parents, last = field.replace("[]", "").split(".")
    holders = [row]
    for name in parents:
        holders = [item for holder in holders for item in
                   (holder[name] if isinstance(holder[name], list) else [holder[name]])]
    for holder in holders:
        del holder[last]
    return row


def test_the_docs_list_every_layout_and_each_required_field_is_refused_as_missing(tmp_path):
    tables = doc_tables()
    assert set(tables) == set(sources.SOURCE_FORMATS)
    for layout, row in valid_rows().items():
        required = [name for name, needed in tables[layout] if needed.startswith("yes")]
        assert set(sources.SIGNATURES[layout]) <= {name.split(".")[0].split("[")[0] for name, _ in tables[layout]}
        for name in required:
            error = convert_error(tmp_path, [without(row, name)], layout)
            assert (error.field, error.message.split(" (")[0]) == (name.replace("[]", ".0"), "missing"), (layout, name)


@pytest.mark.parametrize("actual", sources.SOURCE_FORMATS)
def test_a_row_of_another_layout_is_told_which_layout_it_looks_like(tmp_path, actual):
    row = valid_rows()[actual]
    for read_as in sources.SOURCE_FORMATS:
        if read_as == actual:
            continue
        error = convert_error(tmp_path, [row, row], read_as)  # two lines: a one-line file is one object
        flag = "leave --from out" if actual == "vidoseek" else f"pass --from {actual}"
        assert f"(this looks like the {actual} layout" in str(error) and flag in str(error), (read_as, str(error))
        assert str(error).startswith("line 1: field "), str(error)


def test_one_wording_for_one_problem_in_every_layout(tmp_path):
    rows = valid_rows()
    missing = [convert_error(tmp_path, [without(rows["vidoseek"], "meta_info.file_name")], "vidoseek"),
               convert_error(tmp_path, [without(rows["slidevqa"], "deck_name")], "slidevqa")]
    assert [error.message.split(" (")[0] for error in missing] == ["missing", "missing"]
    empty = [convert_error(tmp_path, [{**rows["vidoseek"], "query": ""}], "vidoseek"),
             convert_error(tmp_path, [{**rows["slidevqa"], "question": ""}], "slidevqa")]
    assert {error.message for error in empty} == {"expected a non-empty string, got an empty string"}
    pages = [convert_error(tmp_path, [{**rows["vidoseek"], "meta_info": {"file_name": "a.pdf",
                                                                         "reference_page": ["3"]}}], "vidoseek"),
             convert_error(tmp_path, [{**rows["slidevqa"], "evidence_pages": ["3"]}], "slidevqa")]
    assert {error.message for error in pages} == {"expected an integer page number, got a string"}
    answers = [convert_error(tmp_path, [{**rows["vidoseek"], "reference_answer": ""}], "vidoseek"),
               convert_error(tmp_path, [{**rows["slidevqa"], "answer": ""}], "slidevqa")]
    assert {error.message for error in answers} == {
        "expected a non-empty string or a number, got an empty string"}


def test_a_missing_field_of_no_known_layout_points_at_the_layouts_fields(tmp_path):
    error = convert_error(tmp_path, [{"qa_id": 1, "question": "q"}], "slidevqa")
    assert str(error) == "line 1: field 'deck_name': missing (the slidevqa layout's fields are listed in docs/datasets.md)"


def test_the_docs_examples_are_what_the_command_prints(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "samples.json").write_text(json.dumps([valid_rows()["mmlongbench-doc"]]))
    write_jsonl(tmp_path / "qa.jsonl", [valid_rows()["mmdocir"], valid_rows()["mmdocir"]])
    printed = []
    for argv in (["samples.json"], ["qa.jsonl", "--from", "slidevqa"]):
        assert cli_main(["convert-dataset", *argv, "--out", "t.parquet"]) == 2
        printed.append(capsys.readouterr().err.strip())
    for line in printed:
        assert f"\n{line}\n" in DOC.read_text(), line
