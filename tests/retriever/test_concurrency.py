"""Many parallel clients against the real server in a thread: no errors, right answers."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from retriever_server.api.admission import AdmissionLimits
from retriever_server.api.testing import serve_in_thread
from retriever_server.sample_corpus import SAMPLE_FACTS

pytestmark = pytest.mark.process  # servers or subprocesses (tests/conftest.py)

CLIENTS = 16
BATCHES = 4


def test_parallel_clients_get_correct_answers(sample_index):
    queries = list(SAMPLE_FACTS)
    expected = [f"{d}_{p}" for d, p in SAMPLE_FACTS.values()]

    # Correctness under concurrency, not admission: these plain clients do not retry refusals,
    # so every request may queue (up to max_wait_s) instead of the default short queue.
    with serve_in_thread(sample_index, admission=AdmissionLimits(queue_services=None)) as base_url:
        assert base_url.startswith("http://127.0.0.1:")

        def client_run(k: int) -> list[str]:
            problems = []
            # Each client rotates the query order so batches differ between clients.
            order = queries[k % len(queries):] + queries[:k % len(queries)]
            with httpx.Client(base_url=base_url, timeout=30) as http:
                for b in range(BATCHES):
                    body = {"query": order, "id": [SAMPLE_FACTS[q][0] for q in order], "top_n": 2}
                    r = http.post("/batch_search", json=body)
                    if r.status_code != 200:
                        problems.append(f"search {r.status_code}")
                        continue
                    got = [hits[0]["id"] for hits in r.json()]
                    want = [f"{SAMPLE_FACTS[q][0]}_{SAMPLE_FACTS[q][1]}" for q in order]
                    if got != want:
                        problems.append(f"client {k} batch {b}: {got} != {want}")
                    f = http.post("/batch_fetch", json={"query": [f"text, {1 + b}"], "id": ["annual_report"]})
                    if f.status_code != 200 or f.json()[0]["id"] != f"text, {1 + b}":
                        problems.append(f"fetch {f.status_code}")
            return problems

        with ThreadPoolExecutor(CLIENTS) as pool:
            problems = [p for result in pool.map(client_run, range(CLIENTS)) for p in result]
        assert problems == []
        assert len(set(expected)) == len(expected)  # the facts name distinct pages

    # After the context exits the server is gone.
    try:
        httpx.get(f"{base_url}/health", timeout=2)
        still_up = True
    except httpx.TransportError:
        still_up = False
    assert not still_up
