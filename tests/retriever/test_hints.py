"""The commands and flags that the retriever's and the dataset converters' messages name exist
(issue 33, item 2: a hint must name a flag the user can pass).

Every message string (a string in code, not a docstring; an f-string's fields read as ``X``) of
``retriever_server/`` and ``vrag_rollout/data/`` is checked:

- a command in backticks (`` `vrag-retriever index DOCS --out X` ``) parses with that program's
  own argument parser, placeholders standing for its values (a bare `` `vrag-retriever index` ``
  names the command and is not parsed);
- a subcommand written with flags outside backticks (``convert-dataset --index X``) names flags
  of that subcommand, each with a value where the flag takes one;
- any other ``--flag`` is a flag of the module's own program.

Commands computed at run time (`retriever_server.indexing.suggest`) are run as printed by
``tests/rollout/test_dataset_first_hour.py``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from retriever_server.cli import build_parser as retriever_parser
from vrag_rollout.cli import build_parser as rollout_parser

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = {"vrag-retriever": retriever_parser, "vrag-rollout": rollout_parser}
# The modules whose messages are checked, and the program each one's messages speak of.
MODULES = {**{path: "vrag-retriever" for path in sorted((ROOT / "retriever_server").rglob("*.py"))},
           **{path: "vrag-rollout" for path in sorted((ROOT / "vrag_rollout" / "data").glob("*.py"))},
           # the rollout commands' own checks and hints
           **{ROOT / "vrag_rollout" / "devkit" / name: "vrag-rollout" for name in ("job_checks.py", "rollout_job.py")},
           ROOT / "vrag_rollout" / "cli.py": "vrag-rollout"}
_BACKTICKED = re.compile(r"`([^`]+)`")
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def takes_value(parser: argparse.ArgumentParser, flag: str) -> bool:
    action = next(a for a in parser._actions if flag in a.option_strings)
    return action.nargs != 0 and action.nargs != "?"


SUBCOMMANDS = {name: (program, sub) for program, build in PROGRAMS.items()
               for name, sub in subcommands(build()).items()}
PROGRAM_FLAGS = {program: {flag for sub in subcommands(build()).values() for action in sub._actions
                           for flag in action.option_strings} for program, build in PROGRAMS.items()}


# A subcommand followed by flags, each with the word after it if that is no flag (its value).
_INLINE = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, SUBCOMMANDS)) + r")"
                     r"((?:\s+--[a-z][a-z0-9-]*(?:\s+[^\s-][^\s)`;,]*)?)+)")


def messages(path: Path) -> list[tuple[int, str]]:
    """(line, text) of the module's string constants and f-strings that are not docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Expr) and isinstance(node.value, (ast.Constant, ast.JoinedStr))}
    parts_of_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
                         for part in node.values}
    found = []
    for node in ast.walk(tree):
        if id(node) in docstrings or id(node) in parts_of_fstrings:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):
            found.append((node.lineno, "".join(part.value if isinstance(part, ast.Constant) else "X"
                                               for part in node.values)))
    return found


def problems_of(text: str, program: str) -> list[str]:
    """What is wrong with the commands and flags one message names."""
    problems, checked = [], set()
    for span in _BACKTICKED.finditer(text):
        words = span.group(1).split()
        if words[:1] and words[0] in PROGRAMS:
            checked.update(range(*span.span()))
            if len(words) > 2:  # more than a command's name: it must parse as written
                problems += parse_problem(words[0], span.group(1))
    for match in _INLINE.finditer(text):
        if match.start() in checked:
            continue
        checked.update(range(*match.span()))
        problems += inline_problems(match.group(1), match.group(2).split())
    flags = PROGRAM_FLAGS[program]
    problems += [f"{flag}: no such flag of {program}" for flag in _FLAG.findall(
        "".join(ch for k, ch in enumerate(text) if k not in checked)) if flag not in flags]
    return problems


def parse_problem(program: str, command: str) -> list[str]:
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # argparse's usage message
            PROGRAMS[program]().parse_args(shlex.split(command)[1:])
    except SystemExit:
        return [f"`{command}` does not parse as {program}'s command line"]
    return []


def inline_problems(subcommand: str, tokens: list[str]) -> list[str]:
    program, parser = SUBCOMMANDS[subcommand]
    flags = {flag for action in parser._actions for flag in action.option_strings}
    problems = []
    for k, token in enumerate(tokens):
        if not token.startswith("--"):
            continue
        if token not in flags:
            problems.append(f"{subcommand} {token}: {program} {subcommand} has no such flag")
        elif takes_value(parser, token) and (k + 1 == len(tokens) or tokens[k + 1].startswith("-")):
            problems.append(f"{subcommand} {token}: the flag takes a value, and the hint gives none")
    return problems


def test_every_command_and_flag_a_message_names_exists():
    found = [f"{path.relative_to(ROOT)}:{line}: {problem}\n  in {text!r}"
             for path, program in MODULES.items() for line, text in messages(path)
             for problem in problems_of(text, program)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("text, bad", [
    ("(convert-dataset --index --drop-missing leaves their questions out)", "takes a value"),
    ("convert again with `vrag-rollout convert-dataset --index`", "does not parse"),
    ("index it with `vrag-retriever index DOCS --into X`", "does not parse"),
    ("serve it with --retriever-prefligt warn", "no such flag"),
    ("(convert-dataset --drop-missng leaves them out)", "no such flag"),
])
def test_the_check_finds_hints_that_cannot_be_followed(text, bad):
    assert any(bad in problem for problem in problems_of(text, "vrag-rollout")), problems_of(text, "vrag-rollout")


@pytest.mark.parametrize("text", [
    "build one with `vrag-retriever index DOCS --out X`",
    "re-run `vrag-retriever index`",
    "(`vrag-rollout convert-dataset QUESTIONS --out OUT --index INDEX --drop-missing` leaves them out)",
    "or leave such questions out with --drop-missing",
    "(convert-dataset --index maps slide numbers through it)",
])
def test_the_check_passes_hints_that_can_be_followed(text):
    assert problems_of(text, "vrag-rollout") == []
