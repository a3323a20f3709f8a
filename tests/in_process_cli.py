"""Running a doc's console-script command line in this process, on the session's shared engines.

Used by tests/test_doc_commands.py for the commands that load torch (`demo`, `rollout`, `learn`,
`check`, `view`): in a subprocess each paid the interpreter's imports (torch, transformers, vLLM:
about 10 s on a loaded CPU), and every engine command its own vLLM start (15 to 20 s more). Run
here, a command keeps what makes it the doc's command as written:

- its words are the ones bash makes of the line (`shell_words`: bash itself expands the quotes,
  strips the comment and runs each ``$(...)`` substitution, a real console-script start), so a
  line that would not parse, or a substitution that fails, fails here as in a shell;
- the program named is the session's console script, and what runs is that script's own entry
  point (`console_entry`: the installed distribution's ``console_scripts`` entry of that name);
- it runs in the session directory (relative paths), with this process's environment restored
  after it, and its exit status is the entry point's return value or ``SystemExit`` code; an
  exception is a traceback on stderr and status 1, as Python prints it when a script dies;
- stdout and stderr are both captured at the file-descriptor level (``capfd``), so what the
  command's libraries print (vLLM, tqdm, logging) is read as a subprocess's output would be.

The one difference is the engine (`shared_engines`): a command that would start a vLLM engine is
handed the session's engine of the same model (tests/conftest.py `engines`), after a check that
what the command asks for is what that engine serves (dtype, logprobs mode, eager mode, at least
its context and image limits); the engine is synced back to the model's own weights after every
command that was handed it (`learn` trains it in place), and checked to serve them when the
context ends.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import traceback
from contextlib import contextmanager
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import vrag_rollout.engine.llm as engine_llm

_OPERATORS = set("|&;<>()")


def simple_command(line: str) -> bool:
    """`line` is one simple command (words, quotes, comments, quoted ``$(...)``): no pipe,
    list, redirection, subshell or background job, which only a shell can run."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return not any(token and set(token) <= _OPERATORS for token in lexer)
    except ValueError:  # unbalanced quotes: let bash say so
        return False


def shell_words(line: str, cwd: Path, timeout_s: float) -> tuple[list[str], int, str]:
    """(the words bash makes of `line` in `cwd`, bash's exit status, its stderr): bash expands the
    line as it would run it (quotes, comment, ``$(...)`` substitutions) and prints the words."""
    done = subprocess.run(["bash", "-c", "printf '%s\\0' " + line], cwd=cwd, capture_output=True,
                          timeout=timeout_s, stdin=subprocess.DEVNULL)
    words = done.stdout.decode(errors="replace").split("\0")[:-1]
    return words, done.returncode, done.stderr.decode(errors="replace")


def console_entry(program: str, cwd: Path) -> Optional[Callable[..., Any]]:
    """The entry point that `program` (a path like ``.venv/bin/vrag-rollout``, relative to `cwd`)
    runs, when it is an installed console script of this environment; else None."""
    path = cwd / program
    if not (path.is_file() and os.access(path, os.X_OK)):
        return None
    found = entry_points(group="console_scripts", name=Path(program).name)
    if not found:
        return None
    entry = next(iter(found))
    module, _, attr = entry.value.partition(":")
    if f"from {module} import {attr}" not in path.read_text(errors="replace"):
        return None  # a script of that name, not the installed entry point's
    return entry.load()


def run_in_process(entry: Callable[..., Any], argv: list[str], cwd: Path, capfd) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `entry(argv)` run in `cwd` (module docstring)."""
    capfd.readouterr()  # whatever came before is not the command's
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.chdir(cwd)
    try:
        code = entry(argv)
    except SystemExit as stop:
        code = stop.code
        if isinstance(code, str):  # sys.exit("message"): printed, status 1
            print(code, file=sys.stderr)
            code = 1
    except Exception:  # noqa: BLE001 - a script dying of it prints the traceback, status 1
        traceback.print_exc()
        code = 1
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    out, err = capfd.readouterr()
    return (0 if code is None else int(code)), out, err


# What a command's engine request must agree on with the shared engine (else its results would
# not be the ones its own engine gives), and the limits it must fit within.
_SAME = ("dtype", "logprobs_mode", "enforce_eager")
_AT_MOST = {"max_model_len": lambda kwargs: kwargs.get("max_model_len"),
            "images": lambda kwargs: (kwargs.get("limit_mm_per_prompt") or {}).get("image")}


def engine_mismatch(asked: dict, shared: dict) -> Optional[str]:
    """What in `asked` (a command's `create_llm` kwargs) the engine started with `shared` kwargs
    cannot serve as asked, or None."""
    for key in _SAME:
        if asked.get(key) != shared.get(key):
            return f"{key} {asked.get(key)!r}, the shared engine's is {shared.get(key)!r}"
    for name, read in _AT_MOST.items():
        want, have = read(asked), read(shared)
        if want is not None and have is not None and want > have:
            return f"{name} {want}, more than the shared engine's {have}"
    return None


@contextmanager
def shared_engines(engines: Callable[[Any], Any], engine_args: dict) -> Iterator["EngineLoan"]:
    """While active, `vrag_rollout.engine.llm.create_llm` (what `build_llm` and every job start
    their engine with) hands out `engines(model)`, the session's engine of that model started with
    `engine_args`, once `engine_mismatch` finds nothing. Yields the `EngineLoan`: call its
    `restore` after each command; on exit it restores and checks every engine lent."""
    loan = EngineLoan(engines, engine_args)
    real = engine_llm.create_llm

    def create_llm(**kwargs: Any) -> Any:
        if loan.starting:  # the fixture's own start of a shared engine
            loan.starting_seen = True
            return real(**kwargs)
        return loan.hand_out(kwargs)

    engine_llm.create_llm = create_llm
    try:
        yield loan
    finally:
        engine_llm.create_llm = real
        loan.close()


class EngineLoan:
    """The engines `shared_engines` handed out, and their models' original weights."""

    def __init__(self, engines: Callable[[Any], Any], engine_args: dict):
        self.engines, self.engine_args = engines, engine_args
        self.starting = self.starting_seen = False
        self.handed: list[str] = []  # models, in order of the requests
        self.lent: dict[str, Any] = {}  # model -> engine, since the last `restore`
        self.touched: dict[str, Any] = {}  # model -> engine, every one lent
        self.originals: dict[str, Any] = {}  # model -> its own weights (fp32, as learn loads them)
        self.start_s: dict[str, float] = {}  # model -> seconds its shared engine took to start here

    def hand_out(self, kwargs: dict) -> Any:
        model = str(kwargs.get("model"))
        if (problem := engine_mismatch(kwargs, self.engine_args)) is not None:
            raise AssertionError(f"the command asks for an engine of {model} with {problem}: it cannot share "
                                 "the session's engine (run it as a process: AS_A_PROCESS)")
        self.starting, began = True, time.monotonic()
        try:
            llm = self.engines(model)
        finally:
            self.starting = False
        if self.starting_seen:
            self.start_s[model] = time.monotonic() - began
            self.starting_seen = False
        self.handed.append(model)
        self.lent[model] = self.touched[model] = llm
        return llm

    def restore(self) -> None:
        """Sync every engine lent since the last call back to its model's own weights (a `learn`
        trained it in place; the next command, like a fresh process, starts from the model)."""
        from vrag_rollout.engine.weights import sync_weights

        for model, llm in self.lent.items():
            sync_weights(llm, self.original(model))
        self.lent.clear()

    def close(self) -> None:
        """Restore, then check that every engine lent serves its model's weights (the session's
        later tests share it)."""
        from transformers import AutoProcessor

        from vrag_rollout.engine.weights import check_synced

        self.restore()
        for model, llm in self.touched.items():
            check_synced(llm, self.original(model), AutoProcessor.from_pretrained(model))

    def original(self, model: str) -> Any:
        if model not in self.originals:
            import torch
            from transformers import AutoModelForImageTextToText

            self.originals[model] = AutoModelForImageTextToText.from_pretrained(model, dtype=torch.float32).eval()
        return self.originals[model]
