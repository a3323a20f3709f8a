"""The group sync's exit guarantee on a real gloo group of two processes: whatever the source
rank's compute raises (an interrupt, an exception that cannot be pickled), every rank raises
within seconds; none is left waiting in the broadcast."""

from __future__ import annotations

import multiprocessing
import queue
import socket
import threading

import pytest

pytestmark = pytest.mark.process  # servers or subprocesses (tests/conftest.py)


class Unpicklable(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.lock = threading.Lock()  # pickling fails on it


def _compute(kind: str):
    if kind == "interrupt":
        raise KeyboardInterrupt
    if kind == "exit":
        raise SystemExit(3)
    if kind == "unpicklable":
        raise Unpicklable("a retriever bug")
    return {"pages": [1, 2]}


KINDS = ("value", "interrupt", "exit", "unpicklable")


def run_rank(rank: int, port: int, results, release) -> None:
    import torch.distributed as dist

    from vrag_rollout.engine.group_sync import GroupSync

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    sync = GroupSync(dist.group.WORLD, source_rank=0)
    for kind in KINDS:  # in turn: a rank left waiting in one share never reaches the next
        try:
            value = sync.share(lambda: _compute(kind))
            results.put((kind, rank, "ok", value))
        except BaseException as error:  # noqa: BLE001 - what each rank raised is the result
            results.put((kind, rank, type(error).__name__, str(error)))
    # Alive until the test is done: a rank left waiting must show as a timeout, not be
    # released by its peer's exit.
    release.wait(60)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def raised() -> dict:
    """(kind, rank) -> (what share returned or raised, detail), from one group of two processes."""
    context = multiprocessing.get_context("spawn")
    results, release = context.Queue(), context.Event()
    port = _free_port()
    procs = [context.Process(target=run_rank, args=(rank, port, results, release), daemon=True) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    seen = {}
    try:
        for k in range(len(KINDS) * len(procs)):
            # The first answer waits for both processes to start (torch, gloo) on a busy machine.
            kind, rank, name, detail = results.get(timeout=120 if k == 0 else 30)
            seen[kind, rank] = (name, detail)
    except queue.Empty:
        pass  # the test of the share that never returned fails on its missing entry
    finally:
        release.set()
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    return seen


def test_a_value_reaches_every_rank(raised):
    assert raised["value", 0] == raised["value", 1] == ("ok", {"pages": [1, 2]})


@pytest.mark.parametrize("kind, name", [("interrupt", "KeyboardInterrupt"), ("exit", "SystemExit")])
def test_an_interrupt_on_the_source_reaches_every_rank(raised, kind, name):
    assert raised.get((kind, 0), ("missing",))[0] == name
    assert raised.get((kind, 1), ("missing: rank 1 still waits in the broadcast",))[0] == name


def test_an_exception_that_cannot_be_pickled_still_reaches_every_rank(raised):
    assert raised.get(("unpicklable", 0)) == ("Unpicklable", "a retriever bug")  # the source's own error
    name, detail = raised.get(("unpicklable", 1), ("missing: rank 1 still waits in the broadcast", ""))
    assert name == "RuntimeError" and "Unpicklable on the source rank: a retriever bug" in detail
