"""Shared by the doc-command tests (tests/test_doc_commands.py, tests/retriever/test_doc_commands.py):
reading a Markdown file's ```bash blocks as commands, and running one command with its output
kept in files."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


@dataclass
class Command:
    text: str
    expected: str | None = None


@dataclass
class Block:
    heading: str
    lines: list[str]
    commands: list[Command] = field(default_factory=list)


def bash_blocks(doc: str) -> list[Block]:
    """The doc's ```bash blocks, each split into commands (continuation lines joined) with the
    ``# -> `` line after a command as its expected output."""
    blocks, heading, block = [], "", None
    for line in doc.splitlines():
        if block is None:
            if line.startswith("#"):
                heading = line.lstrip("# ")
            elif line.strip() == "```bash":
                block = Block(heading, [])
        elif line.strip() == "```":
            blocks.append(block)
            block = None
        else:
            block.lines.append(line)
    for block in blocks:
        pending = ""
        for line in block.lines:
            if pending:
                pending += "\n" + line
            elif line.startswith("# -> "):
                block.commands[-1].expected = line.removeprefix("# -> ")
                continue
            elif not line.strip() or line.lstrip().startswith("#"):
                continue
            else:
                pending = line
            if not pending.endswith("\\"):
                block.commands.append(Command(pending))
                pending = ""
    return blocks


def run_logged(command: str, cwd: Path, number: int | str, timeout_s: float,
               background_groups: Optional[list] = None) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `bash -c command` in `cwd`, its output in files
    (`.outN`, `.errN`: a server started with & keeps writing after bash exits, which a pipe would
    not survive); killed with its process group after `timeout_s` (code -1). With
    `background_groups`, the command's process group is added to it for the caller to stop."""
    out, err = cwd / f".out{number}", cwd / f".err{number}"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, stdout=stdout, stderr=stderr,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        if background_groups is not None:
            background_groups.append(proc.pid)  # the job's process group, led by this bash
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = -1
    return code, out.read_text(errors="replace"), err.read_text(errors="replace")
