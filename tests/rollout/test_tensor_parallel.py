"""Two tensor-parallel ranks (two processes, a gloo group on CPU) with a retriever that is down on
rank 1 only: with the group sync, both schedules give identical episodes and identical engine
request sequences on both ranks; without it (the control) they diverge, so the check can fail."""

from __future__ import annotations

import multiprocessing
import pickle
import socket

import pytest

from tests.rollout.tp_ranks import run_rank

pytestmark = pytest.mark.engine  # each rank is a process with its own engine


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("tp")
    context = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [context.Process(target=run_rank, args=(rank, port, str(tiny_model_dir), str(out / f"{rank}.pkl")))
             for rank in (0, 1)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=300)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        assert proc.exitcode == 0, f"rank process exited with {proc.exitcode}"
    return [pickle.loads((out / f"{rank}.pkl").read_bytes()) for rank in (0, 1)]


@pytest.mark.parametrize("mode", ["sync", "continuous"])
def test_ranks_see_identical_episodes_and_engine_requests(ranks, mode):
    zero, one = ranks[0][(mode, True)], ranks[1][(mode, True)]
    for key in ("responses", "loss_mask", "position_ids", "termination", "page_ids", "engine_log"):
        assert zero[key] == one[key], f"{mode}: {key} differ between the ranks"
    assert zero["retriever_errors"] == one["retriever_errors"] == 0  # rank 1's outage never showed
    assert any(pages for row in zero["page_ids"] for pages in row)  # retrieval really happened
    if mode == "continuous":
        steps = {entry[1] for entry in zero["engine_log"] if entry[0] == "add"}
        assert len(steps) > 2  # requests really entered at different engine steps


@pytest.mark.parametrize("mode", ["sync", "continuous"])
def test_without_the_sync_the_ranks_diverge(ranks, mode):
    zero, one = ranks[0][(mode, False)], ranks[1][(mode, False)]
    assert one["retriever_errors"] > 0 and zero["retriever_errors"] == 0
    assert zero["responses"] != one["responses"] and zero["engine_log"] != one["engine_log"]
