"""Slow subprocess work that starts when collection ends and that tests read when they run.

In-process tests use one core: tests/conftest.py sets one OpenMP thread per process (its
subprocesses inherit it; a vLLM engine start leaves the count as it was). Work that is a chain of
subprocesses (the learn loop's 12-step runs, in a process with its own engine) can therefore run
on the other core beside them.
A test that needs such work is marked
``@pytest.mark.background.with_args(work)`` (``with_args``: the argument is a function), or uses
a fixture decorated ``@uses(work)``; when the
session's tests are collected and selected, tests/conftest.py starts each marked ``work`` once,
``work(work_dir, job)``, and moves the marked tests to the end of the session, so the work has
all the other tests' time to finish. A test or fixture gets the work's return value (or its
exception) from ``result(work, tmp_path_factory)``, waiting for it if need be; work that was not
started (a test that needs it without the mark) runs there and then. Unselected, work does not run.
The jobs run at the same time, each in a thread of its own: on two cores, the in-process tests
and the jobs keep both busy until the last one ends (the jobs' processes add about 3 GB each).

Under pytest-xdist every worker collects the same tests, so each knows the selected works; work
number i starts in worker ``gw{i mod workers}`` alone, in a directory all workers share (beside
their own temporary directories), and publishes its outcome there (``outcome.pkl``) when it ends:
a test in another worker reads it from that file. A worker that owns work waits for it at the
end of its session (other workers may still need it) unless the session stops early.

``work`` runs its commands with ``doc_blocks.run_logged(..., background_groups=job.groups)`` and
empties ``job.groups`` when a command returns (``job.run_command`` does both), and calls
``job.check()`` between commands: when the session ends first (``-x``, Ctrl-C), the running
command's process group is killed and nothing more is started.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
import traceback
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
            value = self.work(self.work_dir, self)
        except BaseException as error:  # noqa: BLE001 - result() re-raises it in the test
            _publish(self.work_dir, {"error": "".join(traceback.format_exception(error))})
            self.future.set_exception(error)
        else:
            _publish(self.work_dir, {"value": value})
            self.future.set_result(value)

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


OUTCOME = "outcome.pkl"
WAIT_S = 3600  # for work another worker runs: its commands' own hang guards are shorter


def _worker() -> tuple[int, int]:
    """(this pytest-xdist worker's number, the worker count); (0, 1) outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER")
    if not name:
        return 0, 1
    return int(name.removeprefix("gw")), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def _work_dir(work: Work, tmp_path_factory) -> Path:
    """`work`'s directory: shared by every xdist worker (whose own temporary directories are
    subdirectories of one base), this session's own otherwise."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = shared / "background" / work.__name__
    path.mkdir(parents=True, exist_ok=True)
    return path


def _publish(work_dir: Path, outcome: dict) -> None:
    try:
        data = pickle.dumps(outcome)
    except Exception as error:  # noqa: BLE001 - a value that does not pickle is the work's failure
        data = pickle.dumps({"error": f"the work's outcome does not pickle: {error!r}"})
    tmp = work_dir / (OUTCOME + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, work_dir / OUTCOME)  # atomic: a reader sees all of it or nothing


def start(works: list[Work], tmp_path_factory) -> None:
    """Start this process's share of `works` (module docstring), each in a daemon thread."""
    index, count = _worker()
    for number, work in enumerate(works):
        if number % count == index and work not in _JOBS:
            job = _JOBS[work] = BackgroundJob(work, _work_dir(work, tmp_path_factory))
            threading.Thread(target=job.run, name=f"background-{work.__name__}", daemon=True).start()


def result(work: Work, tmp_path_factory) -> Any:
    """`work`'s return value: from its job in this process, from the outcome another xdist worker
    published, or run here if none was started."""
    if work in _JOBS:
        return _JOBS[work].future.result()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return _published(_work_dir(work, tmp_path_factory), work)
    job = _JOBS[work] = BackgroundJob(work, _work_dir(work, tmp_path_factory))
    job.run()
    return job.future.result()


def _published(work_dir: Path, work: Work) -> Any:
    deadline = time.monotonic() + WAIT_S
    while not (work_dir / OUTCOME).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{work.__name__}: no outcome in {work_dir} after {WAIT_S} s")
        time.sleep(0.5)
    outcome = pickle.loads((work_dir / OUTCOME).read_bytes())
    if "error" in outcome:
        raise RuntimeError(f"{work.__name__} failed in another worker:\n{outcome['error']}")
    return outcome["value"]


def wait_all(timeout_s: float = WAIT_S) -> None:
    """Let this process's jobs end (another worker may still read them)."""
    for job in _JOBS.values():
        try:
            job.future.exception(timeout=timeout_s)
        except TimeoutError:
            job.cancel()


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
