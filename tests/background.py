"""Slow subprocess work that starts when collection ends and that tests read when they run.

In-process tests use one core: tests/conftest.py sets one OpenMP thread per process (its
subprocesses inherit it; a vLLM engine start leaves the count as it was). Work that is a chain of
subprocesses (the doc-command test's `make demo`, `make learn`, `check`, ...; the learn loop's two
16-step runs, in a process with its own engine) can therefore run on the other core beside them.
A test that needs such work is marked
``@pytest.mark.background.with_args(work)`` (``with_args``: the argument is a function), or uses
a fixture decorated ``@uses(work)``; when the
session's tests are collected and selected, tests/conftest.py starts each marked ``work`` once,
``work(work_dir, job)``, and moves the marked tests to the end of the session, so the work has
all the other tests' time to finish. A test or fixture gets the work's return value (or its
exception) from ``result(work, tmp_path_factory)``, waiting for it if need be; work that was not
started (a test that needs it without the mark) runs there and then. Unselected, work does not run.
The jobs run at the same time, each in a thread of its own: on two cores, the in-process tests
and the jobs keep both busy until the last one ends (the jobs' processes add about 4 GB each).

``work`` runs its commands with ``doc_blocks.run_logged(..., background_groups=job.groups)`` and
empties ``job.groups`` when a command returns (``job.run_command`` does both), and calls
``job.check()`` between commands: when the session ends first (``-x``, Ctrl-C), the running
command's process group is killed and nothing more is started.
"""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

Work = Callable[[Path, "BackgroundJob"], Any]


class Cancelled(Exception):
    """The session ended before the work did."""


class BackgroundJob:
    def __init__(self, work: Work, work_dir: Path):
        self.work, self.work_dir = work, work_dir
        self.future: Future = Future()
        self.groups: list[int] = []  # process group of the running command (killed on cancel)
        self.cancelled = threading.Event()

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            self.check()
            self.future.set_result(self.work(self.work_dir, self))
        except BaseException as error:  # noqa: BLE001 - result() re-raises it in the test
            self.future.set_exception(error)

    def check(self) -> None:
        """Raise `Cancelled` once the session has ended (call it between commands)."""
        if self.cancelled.is_set():
            raise Cancelled("the session ended before this work did")

    def run_command(self, command: str, cwd: Path, number: int, timeout_s: float) -> tuple[int, str, str]:
        """`doc_blocks.run_logged` of one command, killed if the session ends while it runs."""
        from tests.doc_blocks import run_logged

        self.check()
        try:
            return run_logged(command, cwd, number, timeout_s, self.groups)
        finally:
            self.groups.clear()

    def cancel(self) -> None:
        self.cancelled.set()
        if self.future.done():
            return
        for group in list(self.groups):
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


_JOBS: dict[Work, BackgroundJob] = {}


def start(works: list[Work], tmp_path_factory) -> None:
    """Start each of `works` once, each in a daemon thread of its own."""
    for work in works:
        if work not in _JOBS:
            job = _JOBS[work] = BackgroundJob(work, tmp_path_factory.mktemp(work.__name__))
            threading.Thread(target=job.run, name=f"background-{work.__name__}", daemon=True).start()


def result(work: Work, tmp_path_factory) -> Any:
    """`work`'s return value: from its background job, or run here if none was started."""
    if work not in _JOBS:
        job = _JOBS[work] = BackgroundJob(work, tmp_path_factory.mktemp(work.__name__))
        job.run()
    return _JOBS[work].future.result()


def uses(work: Work) -> Callable:
    """Decorates a fixture function (under ``@pytest.fixture``) that reads ``result(work, ...)``:
    every test using the fixture counts as marked ``background.with_args(work)``."""

    def mark(function: Callable) -> Callable:
        function.background_work = work
        return function

    return mark


def cancel_all() -> None:
    for job in _JOBS.values():
        job.cancel()
