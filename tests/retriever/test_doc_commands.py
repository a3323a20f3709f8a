"""docs/retriever.md's commands run as written (issue 24, item 7: a user's first hour).

Every fenced ``bash`` block of the doc is run, in document order, in one scratch directory: a
user's session, in which the quick start's server (started there with ``&``) answers the later
blocks. ``.venv`` is linked into the directory, as it sits in the repository root, and the doc's
port 8002 is replaced by a free port (on ``vrag-retriever serve`` by adding ``--port``); nothing
else is changed. Each command must exit 0, print no traceback and no error answer (a JSON
``detail``), and print what its ``# -> `` line shows where it has one: JSON compared as JSON,
anything else as text; ``<words>`` stands for any value.

Blocks that cannot run here (they name files of yours, or are synopses with ``[options]``) are
listed in `TEMPLATES` with the reason: a new block is either run or named there.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
from pathlib import Path

import pytest

from retriever_server.cli import build_parser

from tests.doc_blocks import Command, bash_blocks, run_logged

from .serving_helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "retriever.md"
DOC_PORT = "8002"
COMMAND_TIMEOUT_S = 180
# First line of a block that is not run -> why.
TEMPLATES = {
    ".venv/bin/vrag-retriever index report.pdf manuals/ scans/contract_17/ --out index/":
        "your own PDFs and a ColQwen2 checkpoint; the options in [brackets] are a synopsis",
    "vrag-retriever serve --index index/ [--host 127.0.0.1] [--port 8002] [--api-key KEY]":
        "a synopsis of serve's options (their defaults: test_serve_synopsis_shows_the_defaults)",
}
_PLACEHOLDER = re.compile(r"<[A-Za-z0-9 ]+>")


def _json_matches(expected, actual) -> bool:
    if isinstance(expected, str) and _PLACEHOLDER.fullmatch(expected):
        return True
    if isinstance(expected, dict):
        return (isinstance(actual, dict) and expected.keys() == actual.keys()
                and all(_json_matches(v, actual[k]) for k, v in expected.items()))
    if isinstance(expected, list):
        return (isinstance(actual, list) and len(expected) == len(actual)
                and all(_json_matches(e, a) for e, a in zip(expected, actual)))
    return expected == actual and type(expected) is type(actual)


def output_matches(expected: str, actual: str) -> bool:
    try:
        wanted = json.loads(expected)
    except ValueError:
        pattern = ".*?".join(re.escape(part) for part in _PLACEHOLDER.split(expected))
        return re.fullmatch(pattern, actual.strip(), re.S) is not None
    try:
        return _json_matches(wanted, json.loads(actual))
    except ValueError:
        return False


def on_port(command: str, port: int) -> str:
    """The command against ``port`` instead of the doc's 8002."""
    command = command.replace(DOC_PORT, str(port))
    return re.sub(r"(vrag-retriever serve\b(?:(?!--port)[^&|#\n])*?)(\s*(?:[&|#]|$))",
                  rf"\1 --port {port}\2", command, count=1)


class Session:
    """A scratch directory set up like the repository root, where commands run one by one;
    background jobs (the server) are stopped on `close`."""

    def __init__(self, work: Path, port: int):
        self.work, self.port, self.groups, self.count = work, port, [], 0
        (work / ".venv").symlink_to(Path(sys.executable).parent.parent)

    def run(self, command: str) -> tuple[int, str, str]:
        self.count += 1
        background = re.search(r"&\s*(#.*)?$", command, re.M) is not None
        return run_logged(on_port(command, self.port), self.work, self.count, COMMAND_TIMEOUT_S,
                          self.groups if background else None)

    def close(self) -> None:
        for group in self.groups:
            try:
                os.killpg(group, signal.SIGTERM)
            except ProcessLookupError:
                pass


def check(command: Command, code: int, out: str, err: str) -> str | None:
    """What is wrong with a command's outcome, or None."""
    if code != 0:
        return f"exit status {code}"
    if "Traceback" in out + err:
        return "a traceback"
    if '"detail"' in out:
        return "an error answer"
    if command.expected is not None and not output_matches(command.expected, out):
        return f"output other than the doc's {command.expected!r}"
    return None


@pytest.fixture
def session(tmp_path):
    s = Session(tmp_path, free_port())
    try:
        yield s
    finally:
        s.close()


def test_every_bash_block_is_run_or_named_as_a_template():
    first_lines = [b.lines[0] for b in bash_blocks(DOC.read_text())]
    assert set(TEMPLATES) <= set(first_lines), "a template is no longer in the doc"
    assert len(first_lines) - len(TEMPLATES) >= 5  # quick start, reload, formats, ready, health


@pytest.mark.process
def test_doc_commands_run_as_written(session):
    problems, ran = [], 0
    for block in bash_blocks(DOC.read_text()):
        if block.lines[0] in TEMPLATES:
            continue
        for command in block.commands:
            code, out, err = session.run(command.text)
            ran += 1
            if (problem := check(command, code, out, err)) is not None:
                problems.append(f"[{block.heading}] {command.text}\n  -> {problem}\n"
                                f"  stdout: {out[:400]!r}\n  stderr: {err[-400:]!r}")
    assert not problems, "\n\n".join(problems)
    assert ran >= 10


def test_serve_synopsis_shows_the_defaults():
    synopsis = next(b for b in bash_blocks(DOC.read_text())
                    if b.lines[0].startswith("vrag-retriever serve --index index/ ["))
    shown = dict(re.findall(r"\[(--[a-z-]+) (\d+(?:\.\d+)?)\]", "\n".join(synopsis.lines)))
    assert {"--max-in-flight", "--max-queue", "--max-wait", "--max-answer-mib"} <= set(shown)
    args = build_parser().parse_args(["serve", "--index", "x"])
    for option, value in shown.items():
        assert float(value) == getattr(args, option[2:].replace("-", "_")), option


# The checker itself, on outputs it must refuse.
@pytest.mark.parametrize("expected, actual, ok", [
    ('{"a": 1, "v": "<16 hex digits>"}', '{"a":1,"v":"9c1f"}', True),
    ('{"a": 1, "v": "<16 hex digits>"}', '{"a":8,"v":"9c1f"}', False),
    ('{"a": 1}', '{"a": 1, "b": 2}', False),
    ('{"a": 1}', '{"detail": "x"}', False),
    ('[[{"id":"d_2","contents":"/9j/<the rest>', '[[{"id":"d_2","contents":"/9j/4AAQ', True),
    ('[[{"id":"d_2","contents":"/9j/<the rest>', '[[{"id":"d_3","contents":"/9j/4AAQ', False),
    ("safety_manual_4 image/jpeg bytes", "safety_manual_4 image/jpeg bytes\n", True),
    ("safety_manual_4 image/jpeg bytes", "safety_manual_4 image/jpeg str", False),
])
def test_output_matching(expected, actual, ok):
    assert output_matches(expected, actual) is ok


def test_port_rewrite():
    serve = ".venv/bin/vrag-retriever serve --index index/ &  # http://127.0.0.1:8002"
    assert on_port(serve, 9) == \
        ".venv/bin/vrag-retriever serve --index index/ --port 9 &  # http://127.0.0.1:9"
    assert on_port("curl -s localhost:8002/ready", 9) == "curl -s localhost:9/ready"
    assert shlex.split(on_port("vrag-retriever serve --index i", 9))[-2:] == ["--port", "9"]
