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

How a command runs (`Session.run`):

- a ``make`` target: ``make -n`` (a real make, in the copy) prints the recipe lines the target
  runs, its variables expanded, and each line then runs as below, in order, up to the first that
  fails; ``bash scripts/setup.sh`` (the set-up every target runs first) is a real process;
- a ``vrag-rollout`` command that loads torch (`IN_PROCESS`: ``demo``, ``rollout``, ``learn``,
  ``check``, ``view``, ``evaluate``) runs in this process through the console script's own entry
  point, its words expanded by bash (``$(...)`` included: a real console-script start), on the
  session's engine of its model instead of an engine of its own (tests/in_process_cli.py says
  what is kept and checked). As processes these paid ~10 s of imports each and 15 to 20 s per
  engine start: the commands took 3.5 minutes of subprocesses on idle cores (9.3 on a loaded
  machine, where this way takes 2.8);
- every other command, and the ones in `AS_A_PROCESS` (a console script starting its own engine,
  with the settings the CLI gives vLLM), runs as written in ``bash -c``.

Each command must exit 0 and print no traceback; one whose comment says ``# PASS`` must print
PASS, and one whose comment says ``# FAIL`` must exit non-zero with FAIL in its report (and still
no traceback). `WRITES` names files a command must leave behind.

Commands that cannot run here are listed in `NOT_RUN` with the reason, and docs that cannot in
`SKIPPED_DOCS`: a new command is either run or named there. `SUBSTITUTIONS` lists the
commands run with a documented change (a placeholder filled in, or fewer learn steps: the two
learn runs dominate the time), with the reason.
"""

from __future__ import annotations

import faulthandler
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from vrag_rollout.cli import build_parser
from vrag_rollout.devkit.demo import demo_model

from tests.conftest import ENGINE_ARGS
from tests.doc_blocks import bash_blocks, run_logged
from tests.in_process_cli import (console_entry, engine_mismatch, run_in_process, shared_engines, shell_words,
                                  simple_command)

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
    "docs/context-budget.md": "no commands to run; what it says is what tests/rollout/test_context_segments.py, "
                              "tests/rollout/test_context_edit.py and tests/training/test_segment_weighting.py "
                              "check, and its table is scripts/bench_context.py's output",
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
COMMAND_TIMEOUT_S = 600  # a hang guard; the commands share the cores with the other tests

# The vrag-rollout subcommands run in this process (module docstring): the ones that load torch.
IN_PROCESS = {"demo", "rollout", "learn", "check", "view", "evaluate"}
# Command (as run: a doc command, its substitution or a make target's recipe line) -> why it runs
# as a process although `IN_PROCESS` names its subcommand.
AS_A_PROCESS = {
    ".venv/bin/vrag-rollout evaluate --data first_hour/questions.parquet --index first_hour/index "
    "--out first_hour/eval":
        "the one console script that starts its own vLLM engine, with the settings the CLI gives it "
        "(build_llm's, the CPU's default KV cache); the cheapest of the first hour's engine commands",
}

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
    """A fresh-clone copy with a set-up ``.venv``, where commands run one by one (module
    docstring): ``loan`` the session's engines (tests/in_process_cli.py `shared_engines`),
    ``capfd`` pytest's capture of the in-process commands' output."""

    def __init__(self, work: Path, loan, capfd):
        self.work, self.count, self.ran, self.loan, self.capfd = work, 0, set(), loan, capfd
        self.in_process: list[str] = []  # the lines run in this process
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
        if command.startswith("make ") and simple_command(command):
            return self.run_make(command)
        return self.run_line(command, str(self.count))

    def run_make(self, command: str) -> tuple[int, str, str]:
        """The target's recipe lines (``make -n``), each run by `run_line`, up to the first that fails."""
        code, recipe, err = run_logged("make -n --no-print-directory" + command.removeprefix("make"), self.work,
                                       f"{self.count}-make", COMMAND_TIMEOUT_S)
        if code != 0:
            return code, recipe, err
        lines, pending = [], ""
        for line in recipe.splitlines():
            pending = f"{pending}\n{line}" if pending else line
            if not pending.endswith("\\"):
                lines.append(pending)
                pending = ""
        assert lines and not pending, f"{command}: make -n printed no recipe: {recipe!r}"
        outs, errs = [], []
        for number, line in enumerate(lines):
            code, out, err = self.run_line(line, f"{self.count}-{number}")
            outs.append(out)
            errs.append(err)
            if code != 0:
                break
        return code, "".join(outs), "".join(errs)

    def run_line(self, line: str, label: str) -> tuple[int, str, str]:
        """One command line: in this process when it is an `IN_PROCESS` subcommand of the
        ``vrag-rollout`` console script (module docstring), else ``bash -c line``."""
        if self.runs_in_process(line):
            words, code, expand_err = shell_words(line, self.work, COMMAND_TIMEOUT_S)
            entry = console_entry(words[0], self.work) if code == 0 and words else None
            assert entry is not None, f"{line}: {words[:1]} is not the vrag-rollout console script ({expand_err})"
            self.in_process.append(line)
            faulthandler.dump_traceback_later(COMMAND_TIMEOUT_S, exit=True)  # the hang guard
            try:
                code, out, err = run_in_process(entry, words[1:], self.work, self.capfd)
            finally:
                faulthandler.cancel_dump_traceback_later()
                self.loan.restore()  # the next command's engine starts from the model's weights
            return code, out, expand_err + err
        return run_logged(line, self.work, label, COMMAND_TIMEOUT_S)

    @staticmethod
    def runs_in_process(line: str) -> bool:
        if line in AS_A_PROCESS or not simple_command(line):
            return False
        words = shlex.split(line, comments=True)
        return len(words) > 1 and words[0] == ".venv/bin/vrag-rollout" and words[1] in IN_PROCESS


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
    actual = {SUBSTITUTIONS.get(c, (c, ""))[0] for c in commands if c not in NOT_RUN}
    assert set(AS_A_PROCESS) <= actual, "an AS_A_PROCESS command is no longer run"
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


def run_doc_commands(work: Path, loan, capfd) -> tuple[list[str], int, list[str], Session]:
    """Every doc command in a fresh `Session` in `work`: (problems, commands run, their times, the session)."""
    session = Session(work, loan, capfd)
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
    return problems, ran, times, session


def test_doc_commands_run_as_written(tmp_path, engines, capfd):
    with shared_engines(engines, ENGINE_ARGS) as loan:
        problems, ran, times, session = run_doc_commands(tmp_path, loan, capfd)
    with capfd.disabled():
        print("\n" + "\n".join(times))
        for model, seconds in loan.start_s.items():  # not started yet by this worker's other tests
            print(f"{seconds:5.1f}s of the above: starting the shared engine of {model}")
    assert not problems, "\n\n".join(problems)
    assert ran >= 10
    # The heavy commands ran in this process (the make targets' recipe lines among them), each
    # that would start an engine on the session's one of its model: both families'.
    subcommands = {shlex.split(line, comments=True)[1] for line in session.in_process}
    assert subcommands == IN_PROCESS - {"evaluate"}, session.in_process
    assert set(loan.handed) == {str(demo_model(family)[0]) for family in ("qwen2-vl", "qwen3-vl")}, loan.handed
    # README: "Re-record after changing the corpus or the indexer" -- the recorded fixture is
    # what record-fixtures writes today.
    recorded = tmp_path / "tests" / "fixtures" / "sample_retrieval.json"
    assert recorded.read_bytes() == (ROOT / "tests/fixtures/sample_retrieval.json").read_bytes(), \
        "tests/fixtures/sample_retrieval.json is stale: re-record it"


def test_verdict_comments():
    assert check("x  # PASS (gap 1e-6)", 0, "PASS\n{}", "", ROOT) is None
    assert check("x  # PASS (gap 1e-6)", 1, "FAIL\n{}", "", ROOT) is not None
    assert check("x  # FAIL: forward (gap 5)", 1, "FAIL\n{}", "", ROOT) is None
    assert check("x  # FAIL: forward (gap 5)", 0, "PASS\n{}", "", ROOT) is not None
    assert check("x  # FAIL: forward", 1, "Traceback (most recent call last)", "", ROOT) is not None
    assert check("x  # --model DIR", 0, "", "", ROOT) is None


def test_an_in_process_command_exits_and_prints_as_its_process_would(tmp_path, capfd):
    """tests/in_process_cli.py's `run_in_process`: the return value or SystemExit code is the exit
    status, an exception a traceback and status 1 (which `check` reports), in the session
    directory, the environment as it was after."""
    import os

    def passes(argv):
        print("PASS", *argv, Path.cwd() == tmp_path)
        os.environ["VRAG_DOC_TEST_LEAK"] = "1"
        return 0

    def dies(argv):
        raise RuntimeError("boom")

    def usage(argv):
        raise SystemExit(2)

    here = os.getcwd()
    assert run_in_process(passes, ["a"], tmp_path, capfd) == (0, "PASS a True\n", "")
    assert os.getcwd() == here and "VRAG_DOC_TEST_LEAK" not in os.environ
    code, out, err = run_in_process(dies, [], tmp_path, capfd)
    assert code == 1 and "RuntimeError: boom" in err
    assert check("x  # PASS", code, out, err, tmp_path) == "a traceback"
    assert run_in_process(usage, [], tmp_path, capfd)[0] == 2


def test_only_a_simple_command_runs_in_process():
    assert simple_command('.venv/bin/vrag-rollout check a.pt --model "$(.venv/bin/vrag-rollout build-tiny-model)"')
    assert simple_command(".venv/bin/vrag-rollout view a.pt -o a.html   # --truths FILE: the batch's own")
    for line in (".venv/bin/vrag-rollout check a.pt | tee log", ".venv/bin/vrag-rollout check a.pt > log",
                 "cd x && .venv/bin/vrag-rollout check a.pt", ".venv/bin/vrag-retriever serve --index i &",
                 ".venv/bin/vrag-rollout check $(ls *.pt)", '.venv/bin/vrag-rollout check "a.pt'):
        assert not simple_command(line), line
    assert Session.runs_in_process(".venv/bin/vrag-rollout learn --steps 2   # two steps")
    assert not Session.runs_in_process(".venv/bin/vrag-rollout convert-dataset q.json --out q.parquet")
    assert not Session.runs_in_process(".venv/bin/vrag-retriever index docs --out index")
    assert not Session.runs_in_process(next(iter(AS_A_PROCESS)))


def test_a_command_whose_engine_the_shared_one_cannot_be_is_refused():
    assert engine_mismatch(dict(ENGINE_ARGS, model="m", max_model_len=1408, seed=3), ENGINE_ARGS) is None
    assert "dtype 'bfloat16'" in engine_mismatch(dict(ENGINE_ARGS, dtype="bfloat16"), ENGINE_ARGS)
    assert "logprobs_mode" in engine_mismatch(dict(ENGINE_ARGS, logprobs_mode="raw_logprobs"), ENGINE_ARGS)
    assert "max_model_len 8192" in engine_mismatch(dict(ENGINE_ARGS, max_model_len=8192), ENGINE_ARGS)
    assert "images 9" in engine_mismatch(dict(ENGINE_ARGS, limit_mm_per_prompt={"image": 9}), ENGINE_ARGS)
