"""`scripts/easyr1_recipe.sh`, the pinned GPU training recipe: what it would install is checked
against the pins and the docs (a dry run: no GPU, no network here); its data step runs for real on
the sample corpus (index, a train and a validation split by document, page counts recorded); its
train step reaches the trainer's own checks and stops there without EasyR1."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.process  # servers or subprocesses (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "easyr1_recipe.sh"
PINS = dict(line.split("==") for line in (REPO / "scripts" / "easyr1" / "pins.txt").read_text().splitlines()
            if line and not line.startswith("#"))


def recipe(*args, tmp_path: Path, **env) -> subprocess.CompletedProcess:
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=environment)


def test_setup_installs_the_pinned_stack_and_the_pinned_easyr1(tmp_path):
    done = recipe("setup", tmp_path=tmp_path, DRY_RUN="1")
    assert done.returncode == 0, done.stderr
    commands = [line[2:] for line in done.stdout.splitlines() if line.startswith("+ ")]
    installs = [c for c in commands if " install " in c and "--upgrade pip" not in c]
    assert installs and all("-c scripts/easyr1/pins.txt" in c for c in installs), installs
    commit = re.search(r"written against EasyR1 commit `(\w+)`", (REPO / "docs" / "easyr1.md").read_text()).group(1)
    assert f"git -C .easyr1 checkout {commit}" in commands
    torch_minor = ".".join(PINS["torch"].split(".")[:2])
    wheel = next(c for c in installs if "flash_attn" in c)
    assert f"cu12torch{torch_minor}cxx11abi" in wheel
    assert any(c.endswith('-e .[gpu,server]') for c in installs)
    # the project's gpu extra asks for exactly the pinned vLLM, so the two cannot drift
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["gpu"] == [f"vllm=={PINS['vllm']}"]
    # the docs state the same versions
    docs = (REPO / "docs" / "easyr1.md").read_text()
    for name in ("torch", "vllm", "transformers", "omegaconf"):
        assert f"{name} {PINS[name]}" in docs, name


def test_the_vidoseek_step_names_its_source(tmp_path):
    done = recipe("vidoseek", tmp_path=tmp_path, DRY_RUN="1")
    assert done.returncode == 0, done.stderr
    assert "download autumncc/ViDoSeek vidoseek.json vidoseek_pdf_document.zip" in done.stdout
    assert "data data/vrag/source/vidoseek.json data/vrag/source/pdfs" in done.stderr


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The data step on the sample corpus, with questions in ViDoSeek's layout."""
    from retriever_server.sample_corpus import SAMPLE_FACTS, write_sample_corpus

    tmp = tmp_path_factory.mktemp("recipe")
    write_sample_corpus(tmp / "pdfs")
    questions = [{"uid": f"q{k}", "query": f"Which page mentions the {fact}?", "reference_answer": str(page),
                  "meta_info": {"file_name": f"{doc}.pdf", "reference_page": [page]}}
                 for k, (fact, (doc, page)) in enumerate(SAMPLE_FACTS.items())]
    (tmp / "qa.json").write_text(json.dumps(questions))
    data = tmp / "data"
    done = recipe("data", str(tmp / "qa.json"), str(tmp / "pdfs"), tmp_path=tmp, DATA=str(data),
                  VAL_FRACTION="0.4")
    assert done.returncode == 0, done.stderr
    return data, questions, done


def test_the_data_step_writes_a_train_and_a_val_split_by_document(converted):
    data, questions, done = converted
    train, val = (pq.read_table(data / name).to_pydict() for name in ("train.parquet", "val.parquet"))
    assert train["question_id"] and val["question_id"]
    assert sorted(train["question_id"] + val["question_id"]) == sorted(q["uid"] for q in questions)
    assert not set(train["doc_id"]) & set(val["doc_id"])  # no validation document is trained on
    import pypdfium2

    for table in (train, val):
        for doc, count in zip(table["doc_id"], table["page_count"]):
            assert count == len(pypdfium2.PdfDocument(str(data.parent / "pdfs" / f"{doc}.pdf")))
    assert (data / "index" / "manifest.json").is_file() and json.loads((data / "report.json").read_text())["dropped"] == []


def test_the_train_step_reaches_the_trainers_checks(converted, tmp_path):
    data, _, _ = converted
    done = recipe("train", tmp_path=tmp_path, DATA=str(data), VENV=".venv")
    assert done.returncode == 2
    assert "EasyR1" in done.stderr and "retriever ready" not in done.stdout
    assert "data.train_files: no file" not in done.stderr  # the recipe's own data files were found
