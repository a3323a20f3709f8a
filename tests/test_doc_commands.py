"""README.md's and docs/'s commands run as written on a fresh clone (issue 24, the doc-command test).

The approach of ``tests/retriever/test_doc_commands.py`` (which covers docs/retriever.md), for
README.md, docs/saved-batch.md, docs/learning.md and docs/concurrency.md: every fenced ``bash``
block is split into commands, and the commands run in document order, the docs in `DOCS` order
(README first: its ``make demo`` and ``make learn`` write the files the later docs look at), in
one scratch directory, a user's session on a fresh clone:

- the scratch directory holds a copy of the repository's tracked files (what ``git clone`` gives,
  so ``make`` finds the Makefile and scripts/setup.sh);
- ``.venv`` there is the repository's venv, already set up: its entries are linked, and its
  ``.vrag-setup`` stamp is the one scripts/setup.sh computes for this copy, so the setup every
  ``make`` target runs first is its no-op re-run (the first set-up takes minutes and the network,
  and must never reinstall into the shared venv). The venv's editable install runs the
  checkout's code;
- a command identical to one already run in the session (docs/learning.md's ``make learn``,
  after README's) is not run again: its outputs are already there.

Each command must exit 0 and print no traceback; one whose comment says ``# PASS`` must print
PASS, and one whose comment says ``# FAIL`` must exit non-zero with FAIL in its report (and still
no traceback). `WRITES` names files a command must leave behind.

Commands that cannot run here are listed in `NOT_RUN` with the reason, and docs that cannot in
`SKIPPED_DOCS`: a new command is either run or named there. `SUBSTITUTIONS` lists the
commands run with a documented change (a placeholder filled in, or fewer learn steps: the two
learn runs dominate the time, mostly engine and model start-up; the file took 6.5 minutes on two
cores shared with another learn run), with the reason.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vrag_rollout.cli import build_parser

from tests.doc_blocks import bash_blocks, run_logged

ROOT = Path(__file__).resolve().parents[1]
# Run in this order, in one session.
DOCS = ["README.md", "docs/saved-batch.md", "docs/learning.md", "docs/concurrency.md"]
SKIPPED_DOCS = {
    "docs/retriever.md": "run by tests/retriever/test_doc_commands.py",
    "docs/easyr1.md": "needs an EasyR1 checkout and its dependencies (network), a GPU and a real "
                      "checkpoint (Qwen2.5-VL-7B), your qa_train.json and my_index",
    "docs/datasets.md": "no commands to run; its examples are what tests/rollout/test_dataset_first_hour.py "
                        "checks the converter prints",
    "docs/evaluation.md": "its commands need a benchmark's own files, an index of its documents and a "
                          "checkpoint; tests/evaluation/test_evaluate_job.py runs evaluate on questions about the "
                          "sample corpus in two sets' layouts, in both scopes",
    "docs/dense-corpus.md": "its one command is a benchmark of several minutes (scripts/bench_dense_corpus.py), "
                            "not a test",
    "docs/encoder-speed.md": "its commands are benchmarks (scripts/bench_encoder.py), not tests; the "
                             "mechanisms are tested by tests/retriever/test_encoder_pipeline.py",
    "docs/tiny-models.md": "no commands to run; its table is checked against the built models by "
                           "tests/rollout/test_released_shape.py",
    "docs/verl.md": "its jobs need verl's GPU stack, a real checkpoint and your data; what its CPU "
                    "script (scripts/check_verl.py) does is run in-process by "
                    "tests/integrations/test_verl_agent_loop.py (a saved verl batch through `check --forward`)",
}
COMMAND_TIMEOUT_S = 600  # a hang guard; the commands share the cores with the in-process tests

# Command (as in the doc, comment included) -> why it is not run.
NOT_RUN = {
    "make test":
        "the whole test suite, this file included",
    "vrag-retriever index my_pdfs/ --out my_index       # PDFs, folders of PDFs or of page images":
        "your own PDFs (my_pdfs/); docs/retriever.md's quick start runs index on the sample corpus",
    "vrag-retriever serve --index my_index              # 127.0.0.1:8002":
        "your own index (my_index); docs/retriever.md's quick start runs serve",
    "vrag-rollout convert-dataset qa_train.json --out data/vrag/train.parquet --index my_index "
    "--report report.json":
        "your own dataset (qa_train.json) and index (my_index)",
    "scripts/train_easyr1.sh my_index examples/easyr1_vrag.yaml     # retriever on my_index, "
    "then the trainer":
        "EasyR1, a GPU, a real checkpoint and your index (docs/easyr1.md)",
    ".venv/bin/vrag-retriever index my_pdfs/ --out my_index":
        "your own PDFs; tests/rollout/test_rollout_job.py runs these three steps on documents and "
        "questions it writes",
    ".venv/bin/vrag-rollout convert-dataset my_questions.json --out my_questions.parquet --index my_index":
        "your own questions; tests/rollout/test_rollout_job.py converts questions it writes",
    ".venv/bin/vrag-rollout convert-dataset vidoseek.json --from vidoseek --out corpus.parquet --index my_index":
        "ViDoSeek's own file and your index; tests/rollout/test_corpus_rollout.py converts questions in that "
        "layout in corpus scope and rolls them out",
    ".venv/bin/vrag-rollout evaluate --data mmlb.parquet --model my_checkpoint --index my_index --out eval/mmlb":
        "a benchmark's files, their index and your checkpoint; tests/evaluation/test_evaluate_job.py runs "
        "evaluate on questions about the sample corpus",
    ".venv/bin/vrag-rollout rollout --data my_questions.parquet --index my_index --out artifacts/mine.pt":
        "your own questions and index; tests/rollout/test_rollout_job.py runs rollout on its own "
        "documents and questions, and `check` passes the batch",
    ".venv/bin/vrag-rollout learn --out DIR [--steps 40 --batch-size 3 --n 8 --lr 1e-3 --seed 0]":
        "a synopsis of learn's options with their defaults in [brackets] "
        "(test_learn_synopsis_shows_the_defaults)",
}

# Command -> (what is run instead, why).
_LEARN_DIR = "artifacts/learn"  # --out's default, where `make learn` just wrote
SUBSTITUTIONS = {
    ".venv/bin/vrag-rollout check DIR/eval.pt --model DIR/final --forward        # PASS (gap 1e-6)": (
        f".venv/bin/vrag-rollout check {_LEARN_DIR}/eval.pt --model {_LEARN_DIR}/final --forward",
        "DIR is the --out of a learn run: `make learn`'s, artifacts/learn"),
    '.venv/bin/vrag-rollout check DIR/eval.pt --model "$(.venv/bin/vrag-rollout build-tiny-model)" '
    "--forward   # FAIL: forward (gap 5)": (
        f'.venv/bin/vrag-rollout check {_LEARN_DIR}/eval.pt --model '
        '"$(.venv/bin/vrag-rollout build-tiny-model)" --forward',
        "DIR is the --out of a learn run: `make learn`'s, artifacts/learn"),
    # 40 steps take two minutes on two idle cores and many minutes on a loaded CI machine: the
    # same make target with fewer steps (its recipe passes ACTION_FORMAT on to learn's options).
    "make learn": (
        'make learn ACTION_FORMAT="tags --steps 3"',
        "3 steps instead of 40 (time); enough for the final weights to fail the check against "
        "the initial model"),
    "make learn                                   # qwen2-vl, tags; about two minutes on two cores": (
        'make learn ACTION_FORMAT="tags --steps 3"',
        "as README's make learn (already run in the session, so not run again)"),
    # The second family's run, 40 steps (minutes on two cores), as a short run of the
    # same make target into its own directory, so that artifacts/learn stays the qwen2-vl run
    # the checks above read.
    "make learn FAMILY=qwen3-vl ACTION_FORMAT=tool_call": (
        'make learn FAMILY=qwen3-vl ACTION_FORMAT="tool_call --steps 1 --out artifacts/learn-qwen3-vl"',
        "1 step instead of 40 (time), into artifacts/learn-qwen3-vl (keeps artifacts/learn for "
        "the checks)"),
}

# Command -> files (relative to the session directory) it must leave behind.
WRITES = {
    "make demo": ["artifacts/demo_rollout.pt", "artifacts/demo_rollout.html"],
    'make learn ACTION_FORMAT="tags --steps 3"': [f"{_LEARN_DIR}/{name}" for name in
                   ("metrics.jsonl", "reward.png", "eval.pt", "final/config.json")],
}
_VERDICT = re.compile(r"#\s+(PASS|FAIL)\b")


def doc_commands(doc: str) -> list[tuple[str, str]]:
    """(heading, command) of every command of the doc's ```bash blocks, in order."""
    return [(block.heading, command.text)
            for block in bash_blocks((ROOT / doc).read_text()) for command in block.commands]


def all_commands() -> list[tuple[str, str, str]]:
    return [(doc, heading, command) for doc in DOCS for heading, command in doc_commands(doc)]


def copy_tracked_files(dest: Path) -> None:
    """The repository's tracked files (as they are in the working tree) under ``dest``."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def setup_stamp(work: Path) -> str:
    """The stamp scripts/setup.sh wants, computed by its own ``want=`` line in ``work``."""
    line = next((line for line in (work / "scripts" / "setup.sh").read_text().splitlines()
                 if line.startswith("want=")), None)
    assert line is not None, "scripts/setup.sh has no want= line: update this test's venv stamp"
    return subprocess.run(["bash", "-c", f'{line}; printf %s "$want"'], cwd=work, check=True,
                          capture_output=True, text=True).stdout


class Session:
    """A fresh-clone copy with a set-up ``.venv``, where commands run one by one (``job``: the
    background job running them, tests/background.py)."""

    def __init__(self, work: Path, job=None):
        self.work, self.count, self.ran, self.job = work, 0, set(), job
        copy_tracked_files(work)
        venv, real = work / ".venv", Path(sys.executable).parent.parent
        venv.mkdir()
        for entry in real.iterdir():
            if entry.name != ".vrag-setup":
                (venv / entry.name).symlink_to(entry)
        stamp = setup_stamp(work)
        assert re.fullmatch(r"[0-9a-f]{16}", stamp), stamp
        (venv / ".vrag-setup").write_text(stamp + "\n")
        # setup.sh must find the venv set up; else it would rebuild it (pip into the shared venv).
        code, out, err = self.run("bash scripts/setup.sh")
        assert code == 0 and not (out + err).strip(), (code, out, err)

    def run(self, command: str) -> tuple[int, str, str]:
        self.count += 1
        if self.job is None:
            return run_logged(command, self.work, self.count, COMMAND_TIMEOUT_S)
        return self.job.run_command(command, self.work, self.count, COMMAND_TIMEOUT_S)


def check(command: str, code: int, out: str, err: str, work: Path, actual: str = "") -> str | None:
    """What is wrong with a command's outcome, or None."""
    verdict = _VERDICT.search(command)
    if "Traceback" in out + err:
        return "a traceback"
    if verdict and verdict.group(1) == "FAIL":
        if code <= 0 or not re.search(r"^FAIL\b", out, re.M):
            return f"exit status {code} and no FAIL report, where the doc says it fails"
        return None
    if code != 0:
        return f"exit status {code}"
    if verdict and not re.search(r"^PASS\b", out, re.M):
        return "no PASS, where the doc says it passes"
    missing = [name for name in WRITES.get(actual, []) if not (work / name).exists()]
    if missing:
        return f"did not write {missing}"
    return None


def test_every_doc_is_run_or_skipped():
    docs = {"README.md"} | {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert docs == set(DOCS) | set(SKIPPED_DOCS)


def test_every_command_is_run_or_listed():
    commands = [command for _, _, command in all_commands()]
    assert set(NOT_RUN) <= set(commands), "a NOT_RUN command is no longer in the docs"
    assert set(SUBSTITUTIONS) <= set(commands), "a substituted command is no longer in the docs"
    assert not set(NOT_RUN) & set(SUBSTITUTIONS)
    # make demo, README's check and view, saved-batch's check and view, record-fixtures,
    # make learn (twice), the qwen3-vl learn, learning.md's two checks.
    assert len([c for c in commands if c not in NOT_RUN]) >= 11


def test_learn_synopsis_shows_the_defaults():
    synopsis = next(c for c in NOT_RUN if c.startswith(".venv/bin/vrag-rollout learn --out DIR ["))
    shown = dict(re.findall(r"(--[a-z-]+) ([0-9.e-]+)", synopsis.split("[", 1)[1]))
    assert {"--steps", "--batch-size", "--n", "--lr", "--seed"} <= set(shown)
    args = build_parser().parse_args(["learn"])
    for option, value in shown.items():
        assert float(value) == float(getattr(args, option[2:].replace("-", "_"))), option


def run_doc_commands(work: Path, job=None) -> tuple[list[str], int, list[str], Path]:
    """Every doc command in a fresh `Session` in `work`: (problems, commands run, their times, `work`)."""
    session = Session(work, job)
    problems, ran, times = [], 0, []
    for doc, heading, command in all_commands():
        actual = SUBSTITUTIONS.get(command, (command, ""))[0]
        if command in NOT_RUN or actual in session.ran:
            continue
        session.ran.add(actual)
        start = time.monotonic()
        code, out, err = session.run(actual)
        times.append(f"{time.monotonic() - start:5.1f}s {actual}")
        ran += 1
        if (problem := check(command, code, out, err, work, actual)) is not None:
            problems.append(f"[{doc}: {heading}] {actual}\n  -> {problem}\n"
                            f"  stdout: {out[-600:]!r}\n  stderr: {err[-600:]!r}")
    return problems, ran, times, work


# The commands are subprocesses (`make demo`, `make learn`, ...) that start engines: they run
# beside the in-process tests from the start of the session (tests/background.py), and the test
# reads their outcome.
@pytest.mark.engine
@pytest.mark.background.with_args(run_doc_commands)  # with_args: the argument is a function
def test_doc_commands_run_as_written(background):
    problems, ran, times, work = background
    print("\n".join(times))
    assert not problems, "\n\n".join(problems)
    assert ran >= 10
    # README: "Re-record after changing the corpus or the indexer" -- the recorded fixture is
    # what record-fixtures writes today.
    recorded = work / "tests" / "fixtures" / "sample_retrieval.json"
    assert recorded.read_bytes() == (ROOT / "tests/fixtures/sample_retrieval.json").read_bytes(), \
        "tests/fixtures/sample_retrieval.json is stale: re-record it"


def test_verdict_comments():
    assert check("x  # PASS (gap 1e-6)", 0, "PASS\n{}", "", ROOT) is None
    assert check("x  # PASS (gap 1e-6)", 1, "FAIL\n{}", "", ROOT) is not None
    assert check("x  # FAIL: forward (gap 5)", 1, "FAIL\n{}", "", ROOT) is None
    assert check("x  # FAIL: forward (gap 5)", 0, "PASS\n{}", "", ROOT) is not None
    assert check("x  # FAIL: forward", 1, "Traceback (most recent call last)", "", ROOT) is not None
    assert check("x  # --model DIR", 0, "", "", ROOT) is None
