"""Admission control: the gate's rules, and a saturated real server refusing with Retry-After."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from retriever_server.api.admission import AdmissionGate, AdmissionLimits
from retriever_server.api.app import create_app
from retriever_server.api.testing import serve_in_thread
from tests.retriever.serving_helpers import HeldBackend, wait_until

SEARCH = {"query": ["x"], "id": ["a"], "top_n": 1}


# --------------------------------------------------------------------------- the gate alone


def test_gate_runs_queues_then_refuses_in_order():
    async def scenario():
        gate = AdmissionGate(AdmissionLimits(max_in_flight=2, max_queue=2, max_wait_s=5,
                                             queue_services=None))
        assert await gate.enter() is None and await gate.enter() is None  # two slots
        waiters = [asyncio.ensure_future(gate.enter()) for _ in range(2)]
        await asyncio.sleep(0)
        assert (gate.in_flight, gate.queued) == (2, 2)
        refusal = await gate.enter()  # queue full: refused at once
        assert refusal is not None and refusal.reason == "queue_full" and refusal.retry_after_s >= 0
        gate.leave(0.01)  # a slot frees: the first waiter (FIFO) gets it
        await asyncio.sleep(0)
        assert waiters[0].done() and waiters[0].result() is None and not waiters[1].done()
        gate.leave(0.01)
        assert await waiters[1] is None
        gate.leave(0.01)
        gate.leave(0.01)
        assert (gate.in_flight, gate.queued) == (0, 0)

    asyncio.run(scenario())


def test_gate_refuses_a_request_that_waited_past_its_deadline():
    async def scenario():
        gate = AdmissionGate(AdmissionLimits(max_in_flight=1, max_queue=8, max_wait_s=0.05,
                                             queue_services=None))
        assert await gate.enter() is None
        refusal = await gate.enter()  # waits 50 ms, nobody leaves
        assert refusal is not None and refusal.reason == "deadline"
        assert gate.queued == 0
        gate.leave(0.01)
        assert gate.in_flight == 0  # the expired waiter did not take the slot

    asyncio.run(scenario())


def test_retry_after_is_the_predicted_drain_time_rounded_down():
    gate = AdmissionGate(AdmissionLimits(max_in_flight=2))
    gate.in_flight, gate.service_s = 2, 0.4
    assert gate.retry_after() == 0  # 0.4 s of backlog: come back soon
    gate.service_s = 3.0
    assert gate.retry_after() == 3


async def drain(gate, waiters, service_s):
    """Finish every running request, then every waiter admitted in turn: all were admitted."""
    for _ in range(gate.in_flight + len(waiters)):
        gate.leave(service_s)
        await asyncio.sleep(0)
    assert all(w.result() is None for w in waiters) and gate.in_flight == 0


def test_gate_refuses_when_the_predicted_wait_is_too_long():
    async def scenario():
        gate = AdmissionGate(AdmissionLimits(max_in_flight=1, max_queue=100, max_wait_s=0.5,
                                             queue_services=None))
        assert await gate.enter() is None
        gate.service_s = 0.2  # measured mean service time: 3rd in line would wait 0.6 s
        first = [asyncio.ensure_future(gate.enter()) for _ in range(2)]
        await asyncio.sleep(0)
        assert gate.queued == 2
        refusal = await gate.enter()
        assert refusal is not None and refusal.reason == "queue_full"
        await drain(gate, first, 0.2)

    asyncio.run(scenario())


def test_queue_budget_follows_the_measured_service_time():
    async def scenario():
        gate = AdmissionGate(AdmissionLimits(max_in_flight=2, max_queue=100, max_wait_s=5,
                                             queue_services=1))
        assert await gate.enter() is None and await gate.enter() is None
        gate.service_s = 0.1  # a budget of one service: 2 slots -> 2 may wait
        waiters = [asyncio.ensure_future(gate.enter()) for _ in range(2)]
        await asyncio.sleep(0)
        assert gate.queued == 2
        refusal = await gate.enter()  # would wait 1.5 services
        assert refusal is not None and refusal.reason == "queue_full"
        gate.service_s = 1.0  # slower service: the same queue is within the budget again ...
        assert gate.queue_budget() == 1.0
        gate.limits = AdmissionLimits(max_in_flight=2, max_wait_s=0.4, queue_services=1)
        assert gate.queue_budget() == 0.4  # ... but never past max_wait_s
        await drain(gate, waiters, 0.1)

    asyncio.run(scenario())


def test_a_waiter_is_refused_after_four_budgets_not_max_wait():
    async def scenario():
        gate = AdmissionGate(AdmissionLimits(max_in_flight=1, max_queue=8, max_wait_s=30,
                                             queue_services=1))
        assert await gate.enter() is None
        gate.service_s = 0.05  # budget 50 ms: refused after 200 ms, not after 30 s
        start = time.monotonic()
        refusal = await gate.enter()
        waited = time.monotonic() - start
        assert refusal is not None and refusal.reason == "deadline"
        assert 0.19 <= waited < 5
        gate.leave(0.05)
        assert (gate.in_flight, gate.queued) == (0, 0)

    asyncio.run(scenario())


def test_refusal_carries_the_drain_time_in_seconds_and_milliseconds():
    gate = AdmissionGate(AdmissionLimits(max_in_flight=2))
    gate.in_flight, gate.service_s = 2, 0.004  # 2 x 4 ms over 2 slots: 4 ms
    refusal = gate.refusal("queue_full")
    assert (refusal.retry_after_s, refusal.retry_after_ms) == (0, 4)
    gate.service_s = 1.5
    assert gate.refusal("deadline").retry_after_s == 1 and gate.refusal("x").retry_after_ms == 1500
    gate.in_flight = 0
    assert gate.refusal("queue_full").retry_after_ms == 1  # never "0 ms": at least a moment


def test_a_cancelled_waiter_never_leaks_a_slot():
    async def scenario():
        gate = AdmissionGate(AdmissionLimits(max_in_flight=1, max_queue=4, max_wait_s=5,
                                             queue_services=None))
        assert await gate.enter() is None
        waiter = asyncio.ensure_future(gate.enter())
        await asyncio.sleep(0)
        gate.leave(0.01)  # hands the slot to the waiter ...
        waiter.cancel()  # ... which is cancelled before it runs (client went away)
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert (gate.in_flight, gate.queued) == (0, 0)
        assert await gate.enter() is None  # the slot is free again

    asyncio.run(scenario())


def test_limits_are_validated():
    with pytest.raises(ValueError):
        AdmissionLimits(max_in_flight=0)
    with pytest.raises(ValueError):
        AdmissionLimits(max_wait_s=0)
    with pytest.raises(ValueError):
        AdmissionLimits(threads=0)
    with pytest.raises(ValueError):
        AdmissionLimits(queue_services=0)


@pytest.mark.process
def test_threads_cap_the_admitted_requests_that_compute_at_once():
    backend = HeldBackend()
    app = create_app(backend, admission=AdmissionLimits(max_in_flight=3, threads=1, max_wait_s=20,
                                                        queue_services=None))
    backend.hold.clear()
    with serve_in_thread(app) as url, ThreadPoolExecutor(3) as pool, \
            httpx.Client(base_url=url, timeout=30) as http:
        held = [pool.submit(http.post, "/batch_search", json=SEARCH) for _ in range(3)]
        wait_until(lambda: app.state.gate.in_flight == 3, what="three admitted")
        time.sleep(0.2)
        assert backend.entered == 1  # admitted, but only one computes
        assert http.get("/health", timeout=2).status_code == 200
        backend.hold.set()
        assert [f.result().status_code for f in held] == [200] * 3
    assert backend.entered == 3


# --------------------------------------------------------------------------- a real server


@pytest.fixture
def held_server():
    backend = HeldBackend()
    app = create_app(backend, admission=AdmissionLimits(max_in_flight=2, max_queue=2, max_wait_s=20,
                                                        queue_services=None))
    with serve_in_thread(app) as url:
        yield backend, url, app
    backend.hold.set()


@pytest.mark.process
def test_saturated_server_refuses_with_retry_after_and_health_stays_fast(held_server):
    backend, url, app = held_server
    backend.hold.clear()
    with ThreadPoolExecutor(4) as pool, httpx.Client(base_url=url, timeout=30) as http:
        held = [pool.submit(http.post, "/batch_search", json=SEARCH) for _ in range(4)]
        wait_until(lambda: backend.entered == 2 and app.state.gate.queued == 2, what="saturation")

        refused = http.post("/batch_search", json=SEARCH)
        assert refused.status_code == 503
        assert int(refused.headers["Retry-After"]) >= 0  # whole seconds (0: retry soon)
        assert int(refused.headers["Retry-After-Ms"]) >= 1  # the same, in milliseconds
        assert "overloaded" in refused.json()["detail"]
        assert http.post("/batch_fetch", json={"query": ["text, 1"], "id": ["a"]}).status_code == 503

        # Health, readiness and metrics never queue behind the held work.
        health = http.get("/health", timeout=2)
        assert health.status_code == 200 and health.json()["status"] == "healthy"
        ready = http.get("/ready", timeout=2).json()
        assert ready["ready"] and ready["in_flight"] == 2 and ready["queued"] == 2
        metrics = http.get("/metrics", timeout=2).text
        assert 'vrag_retriever_refusals_total{reason="queue_full",route="/batch_search"} 1.0' in metrics
        assert "vrag_retriever_queue_depth 2.0" in metrics
        assert "vrag_retriever_in_flight 2.0" in metrics

        backend.hold.set()
        answers = [f.result() for f in held]
    assert [r.status_code for r in answers] == [200] * 4  # queued work is served, not dropped
    assert all(r.json()[0][0]["id"] == "a_1" for r in answers)
    assert app.state.gate.in_flight == 0 and app.state.gate.queued == 0


@pytest.mark.process
def test_a_request_past_its_deadline_is_refused_not_served_late():
    backend = HeldBackend()
    app = create_app(backend, admission=AdmissionLimits(max_in_flight=1, max_queue=4, max_wait_s=0.3,
                                                        queue_services=None))
    backend.hold.clear()
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        first = threading.Thread(target=http.post, args=("/batch_search",), kwargs={"json": SEARCH})
        first.start()
        wait_until(lambda: backend.entered == 1, what="first request running")
        late = http.post("/batch_search", json=SEARCH)  # waits 0.3 s for a slot that never frees
        assert late.status_code == 503 and int(late.headers["Retry-After"]) >= 0
        assert "deadline" in late.json()["detail"]
        backend.hold.set()
        first.join(timeout=30)
        assert backend.entered == 1  # the refused request never reached the backend
        text = http.get("/metrics").text
        assert 'vrag_retriever_refusals_total{reason="deadline",route="/batch_search"} 1.0' in text
