"""The rollout client against two real retriever processes: backoff on refusals, failover on a
kill -9 mid-run, and no query lost."""

from __future__ import annotations

import threading

import pytest

from retriever_server.sample_corpus import SAMPLE_FACTS
from tests.retriever.serving_helpers import ServerProcess, wait_until
from vrag_rollout.retrieval.client import RetrieverClient

pytestmark = pytest.mark.process  # servers or subprocesses (tests/conftest.py)


@pytest.fixture
def two_replicas(sample_index):
    # Tiny admission limits, so the client's 8 concurrent requests are refused now and then.
    limits = ("--max-in-flight", "1", "--max-queue", "1")
    servers = []
    try:
        servers.append(ServerProcess(sample_index, *limits))
        servers.append(ServerProcess(sample_index, *limits))
        yield servers
    finally:
        for server in servers:
            server.kill()


def test_client_backs_off_and_fails_over_when_a_replica_is_killed(two_replicas):
    a, b = two_replicas
    facts = list(SAMPLE_FACTS.items())
    queries = [q for q, _ in facts] * 60
    doc_ids = [d for _, (d, _) in facts] * 60
    expected = [f"{d}_{p}" for _, (d, p) in facts] * 60
    results: list = []
    with RetrieverClient(f"{a.url}, {b.url}", max_batch=2, max_concurrency=8, timeout=10,
                         down_s=60, overload_budget_s=60) as client:
        worker = threading.Thread(
            target=lambda: results.extend(client.batch_search(queries, doc_ids, top_n=1)))
        worker.start()
        wait_until(lambda: client.stats.calls >= 20, timeout=60, what="progress")
        a.kill()  # SIGKILL mid-run: its in-flight requests die with it
        worker.join(timeout=120)
        assert not worker.is_alive()
        snap = client.stats.snapshot()

    assert len(results) == len(queries)
    failures = [r for r in results if not isinstance(r, list)]
    assert failures == []  # every query answered: pages, no error observation
    assert [hits[0].page_id for hits in results] == expected
    assert snap["failovers"] >= 1  # the killed replica's chunks moved to the live one
    assert snap["overloaded"] >= 1  # refusals happened and were waited out
    assert snap["failures"] == 0 and snap["calls"] < len(queries)  # calls count chunks
    assert b.proc.poll() is None
