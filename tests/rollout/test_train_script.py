"""`scripts/train_easyr1.sh` checks before it starts anything, from any directory, with the
project's environment: EasyR1 importable, the config and its data files, the retriever index
(`vrag_rollout/integrations/easyr1/preflight.py`); each problem names its fix."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from vrag_rollout.integrations.easyr1.preflight import data_files, problems

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "train_easyr1.sh"


def write_config(path: Path, train: str, val: str) -> Path:
    path.write_text(f"data:\n  train_files: {train}\n  val_files: {val}\nworker: {{}}\n")
    return path


def test_overrides_replace_the_configs_data_files():
    config = {"data": {"train_files": "a.parquet", "val_files": "b.parquet", "max_prompt_length": 9}}
    assert data_files(config, ["data.val_files=c.parquet", "worker.rollout.n=2"]) == {
        "train_files": "a.parquet", "val_files": "c.parquet"}


def test_every_problem_is_named_with_its_fix(tmp_path):
    config = write_config(tmp_path / "c.yaml", "data/train.parquet", "hub/dataset@val")
    found = problems(config, tmp_path / "no-index", [], tmp_path, easyr1=None)
    text = "\n".join(found)
    assert "no manifest.json" in text and "vrag-retriever index" in text
    assert "data.train_files: no file" in text and "vrag-rollout convert-dataset" in text
    assert "val_files" not in text  # a hub dataset name is not a local file


def test_nothing_to_report_when_everything_is_there(tmp_path):
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "manifest.json").write_text("{}")
    for name in ("train.parquet", "val.parquet"):
        (tmp_path / name).write_bytes(b"")
    config = write_config(tmp_path / "c.yaml", "train.parquet", str(tmp_path / "val.parquet"))
    assert problems(config, tmp_path / "index", [], tmp_path, easyr1=tmp_path) == []
    assert problems(config, tmp_path / "index", ["data.train_files=gone.parquet"], tmp_path, easyr1=tmp_path) == [
        f"data.train_files: no file {tmp_path / 'gone.parquet'}: write it with `vrag-rollout convert-dataset` "
        f"(docs/easyr1.md), or pass data.train_files=PATH"]


@pytest.mark.process
def test_the_script_checks_first_from_another_directory(tmp_path):
    """Run from elsewhere, without EasyR1 (as here) and without data: it refuses at once, before
    starting the retriever, with the project's python (the system one lacks the project)."""
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "manifest.json").write_text("{}")
    done = subprocess.run(["bash", str(SCRIPT), "index", "data.train_files=nowhere/train.parquet"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert "retriever ready" not in done.stdout and "No module named" not in done.stderr
    assert "data.train_files: no file" in done.stderr and "nowhere/train.parquet" in done.stderr
    assert "is not a retriever index" not in done.stderr  # INDEX_DIR was taken from where we ran it
