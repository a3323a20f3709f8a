"""RetrieverClient's threads and deadlines: close() with calls in flight, finalizers on any thread,
fork, transports that ignore their timeout, a stuck event loop. Every call here runs under a
deadline (`Call.result`, `in_child`), so a hang fails the test instead of stopping the run."""

from __future__ import annotations

import gc
import os
import random
import signal
import threading
import time
from concurrent.futures import Future

import pytest

from tests.retriever.serving_helpers import wait_until
from tests.rollout.test_retriever_client import FakeRetriever, client_for, fake  # noqa: F401 (fixture)
from vrag_rollout.retrieval.blocking import HttpTransport
from vrag_rollout.retrieval.client import RetrieverClient
from vrag_rollout.retrieval.fixtures import RecordingTransport
from vrag_rollout.retrieval.transport import RawAnswer
from vrag_rollout.retrieval.types import FetchSpec, RetrievedPage, RetrieverFailure

pytestmark = pytest.mark.process  # servers or subprocesses (tests/conftest.py)

CLOSED = "this RetrieverClient is closed"
TEXT_1 = ([FetchSpec("text", 1)], ["manual_v2"])


class Call:
    """``fn(*args)`` on a daemon thread (a hung one cannot hold up the test run); ``result(s)``
    waits at most ``s`` seconds, then fails the test."""

    def __init__(self, fn, *args):
        self._box: dict = {}
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self._thread.start()

    def _run(self, fn, args):
        try:
            self._box["value"] = fn(*args)
        except BaseException as e:  # handed to result()
            self._box["error"] = e

    def result(self, seconds: float):
        self._thread.join(seconds)
        assert not self._thread.is_alive(), f"still running after {seconds} s"
        if "error" in self._box:
            raise self._box["error"]
        return self._box["value"]


def bounded(seconds: float, fn, *args):
    return Call(fn, *args).result(seconds)


def in_child(fn, seconds: float = 10.0) -> str:
    """``fn()`` in a forked child: what it returns (or raises) as text, or "hung" when it runs
    past ``seconds`` (it is killed then)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        try:
            try:
                out = str(fn())
            except BaseException as e:
                out = f"{type(e).__name__}: {e}"
            os.write(write, out.encode()[:4000])
        finally:
            os._exit(0)
    os.close(write)
    deadline = time.monotonic() + seconds
    while os.waitpid(pid, os.WNOHANG)[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read)
            return "hung"
        time.sleep(0.02)
    with os.fdopen(read, "rb") as f:
        return f.read().decode()


def is_page(res) -> bool:
    return len(res) == 1 and isinstance(res[0], RetrievedPage)


# --------------------------------------------------------------------------- close()


@pytest.mark.parametrize("blocking", [False, True], ids=["event-loop", "blocking"])
def test_close_ends_a_call_in_flight_at_once(fake, blocking):
    fake.script = [("hang",)]  # answers only when the test ends, past the client's timeout
    if blocking:
        client = RetrieverClient(None, transport=RecordingTransport(HttpTransport(fake.url)), timeout=5.0)
    else:
        client = client_for(fake, timeout=5.0)
    caller = Call(client.batch_fetch, *TEXT_1)
    wait_until(lambda: fake.requests, 5, "the request")
    bounded(2.0, client.close)
    with pytest.raises(RuntimeError) as err:
        caller.result(2.0)
    assert str(err.value) == CLOSED  # not aiohttp's "Session is closed", nor a stopped loop


@pytest.mark.parametrize("blocking", [False, True], ids=["event-loop", "blocking"])
def test_calls_racing_close_get_an_answer_or_closed_in_time(fake, blocking):
    rng = random.Random(0)
    for _ in range(15):
        if blocking:
            client = RetrieverClient(None, transport=RecordingTransport(HttpTransport(fake.url)), max_batch=1)
        else:
            client = client_for(fake, max_batch=1)
        calls = [Call(client.batch_fetch, [FetchSpec("text", 1)] * 3, ["manual_v2"] * 3) for _ in range(4)]
        time.sleep(rng.uniform(0, 0.02))
        bounded(3.0, client.close)
        for call in calls:
            try:
                res = call.result(3.0)
            except RuntimeError as e:
                assert str(e) == CLOSED
            else:
                assert all(isinstance(r, RetrievedPage) for r in res)
        with pytest.raises(RuntimeError, match=CLOSED):
            client.batch_fetch(*TEXT_1)


# --------------------------------------------------------------------------- finalizers


def test_a_client_collected_on_its_own_loop_thread_shuts_down(fake):
    client = client_for(fake)
    client.cycle = client  # only the cycle collector frees it: on whichever thread runs it
    assert is_page(client.batch_fetch(*TEXT_1))
    loop = client._loop.loop
    gc.disable()
    try:
        del client
        loop.call_soon_threadsafe(gc.collect)  # the finalizer runs on the loop's own thread
        wait_until(loop.is_closed, 5, "the loop to close")
    finally:
        gc.enable()


def test_a_client_collected_on_a_pool_thread_closes_its_transport(fake):
    http = HttpTransport(fake.url)
    client = RetrieverClient(None, transport=RecordingTransport(http))
    client.cycle = client
    assert is_page(client.batch_fetch(*TEXT_1))  # a blocking transport: runs on a pool thread
    pool, loop = client._pool, client._loop.loop
    assert len(http._pool.pools) == 1
    gc.disable()
    try:
        del client
        pool.submit(gc.collect)  # the finalizer runs on a thread of the pool it shuts down
        wait_until(lambda: not http._pool.pools and loop.is_closed(), 5, "the transport to close")
    finally:
        gc.enable()


def test_a_call_from_the_loop_thread_raises_instead_of_deadlocking(fake):
    client = client_for(fake)
    assert is_page(client.batch_fetch(*TEXT_1))  # the loop's thread starts with the first call
    seen: Future = Future()

    def on_loop():
        try:
            client.batch_fetch(*TEXT_1)
        except RuntimeError as e:
            seen.set_result(str(e))

    client._loop.loop.call_soon_threadsafe(on_loop)
    assert "event loop" in seen.result(3.0)
    assert is_page(bounded(3.0, client.batch_fetch, *TEXT_1))  # the loop still runs
    bounded(3.0, client.close)


# --------------------------------------------------------------------------- fork


def test_a_forked_child_gets_a_working_fresh_client():
    fake = FakeRetriever(keepalive=True)
    client = client_for(fake)
    try:
        assert is_page(client.batch_fetch(*TEXT_1))
        fake.script = [("hang",)]
        in_flight = Call(client.batch_fetch, *TEXT_1)  # the parent's window has it at fork time
        wait_until(lambda: len(fake.requests) == 2, 5, "the second request")
        parents = set(fake.peers)

        def child():
            res = client.batch_fetch(*TEXT_1)
            return f"{is_page(res)} calls={client.stats.snapshot()['calls']:g} health={client.health()}"

        with client.stats._lock:  # as if a tool thread were counting a call at that instant
            out = in_child(child)
        assert out == "True calls=1 health=True"  # its own loop, windows and (zeroed) stats
        assert fake.peers[2] not in parents  # its own connection, not the parent's socket
        fake.release.set()
        assert is_page(in_flight.result(5.0))
        assert is_page(bounded(5.0, client.batch_fetch, *TEXT_1))  # the parent is unharmed
    finally:
        bounded(5.0, client.close)
        fake.stop()


@pytest.mark.parametrize("how", ["close", "collect"])
def test_a_client_closed_or_collected_in_a_forked_child_does_not_hang(fake, how):
    held = [client_for(fake)]
    assert is_page(held[0].batch_fetch(*TEXT_1))

    def child():
        if how == "close":
            held[0].close()
        held.clear()
        gc.collect()
        return "done"

    assert in_child(child) == "done"
    assert is_page(bounded(5.0, held[0].batch_fetch, *TEXT_1))
    bounded(5.0, held[0].close)


def test_an_http_transport_in_a_forked_child_opens_its_own_connection():
    fake = FakeRetriever(keepalive=True)
    http = HttpTransport(fake.url)
    body = {"query": ["text, 1"], "id": ["manual_v2"]}
    try:
        assert len(http.post("/batch_fetch", body, 2.0)) == 1  # its connection stays in the pool
        assert in_child(lambda: len(http.post("/batch_fetch", body, 2.0))) == "1"
        assert fake.peers[1] != fake.peers[0]  # two processes on one socket would mix answers
        assert len(http.post("/batch_fetch", body, 2.0)) == 1
    finally:
        http.close()
        fake.stop()


# --------------------------------------------------------------------------- deadlines


class Stuck:
    """A blocking transport that ignores its timeout (a custom one, badly written)."""

    def __init__(self):
        self.release = threading.Event()

    def post(self, path, body, timeout):
        self.release.wait(30)
        return []

    def get(self, path, timeout):
        return self.post(path, {}, timeout)

    def close(self):
        self.release.set()


def test_a_blocking_transport_that_ignores_its_timeout_fails_the_chunk_in_time():
    client = RetrieverClient(None, transport=Stuck(), timeout=0.2, retries=0)
    start = time.monotonic()
    res = bounded(4.0, client.batch_fetch, *TEXT_1)
    assert [r.kind for r in res] == ["timeout"] and time.monotonic() - start < 3.0
    assert client.stats.snapshot()["failures/timeout"] == 1
    assert bounded(4.0, client.health) is False
    bounded(2.0, client.close)


def test_a_chunk_waits_for_a_slot_no_longer_than_the_overload_budget(fake):
    fake.script = [("hang",)]
    client = client_for(fake, timeout=5.0, max_concurrency=1, overload_budget_s=0.3)
    first = Call(client.batch_fetch, *TEXT_1)
    wait_until(lambda: fake.requests, 5, "the first request")
    start = time.monotonic()
    res = bounded(4.0, client.batch_fetch, [FetchSpec("text", 2)], ["manual_v2"])
    assert res == [RetrieverFailure("overloaded", "retriever overloaded: no room within 0.3 s; try again later")]
    assert time.monotonic() - start < 2.0
    fake.release.set()
    assert is_page(first.result(5.0))
    bounded(5.0, client.close)


class LoopBlocker:
    """An event-loop transport that blocks the loop itself (a bug in a custom transport)."""

    def __init__(self):
        self.release = threading.Event()

    async def send_async(self, path, body, timeout):
        self.release.wait(30)
        return RawAnswer(b"[]")

    async def get_async(self, path, timeout):
        return None


def test_a_call_raises_at_its_deadline_when_the_event_loop_is_stuck():
    transport = LoopBlocker()
    client = RetrieverClient(None, transport=transport, timeout=0.2, retries=0, overload_budget_s=0.5)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="no answer within"):
        bounded(6.0, client.batch_fetch, *TEXT_1)
    assert time.monotonic() - start < 5.0
    transport.release.set()
    bounded(6.0, client.close)
