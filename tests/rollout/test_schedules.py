"""The continuous schedule's own guarantees on the real engine: several retriever batches out at
once, identical episodes to the synchronized schedule under slow, jittered retrieval, every engine
request aborted when something raises, and where the time went."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from tests.conftest import SAMPLE_RETRIEVAL
from tests.rollout.agent_helpers import make_agent, prompt_batch, sample_prompts
from vrag_rollout.fixtures import FixtureTransport
from vrag_rollout.retriever_client import RetrieverClient


class SlowRetriever:
    """The recorded retriever behind 20-80 ms of random latency; counts calls out at once."""

    def __init__(self, fail_after: int | None = None):
        self.inner = FixtureTransport.load(SAMPLE_RETRIEVAL)
        self.rng = random.Random()
        self.lock = threading.Lock()
        self.out = self.most_out = self.calls = 0
        self.fail_after = fail_after

    def post(self, path, body, timeout):
        with self.lock:
            self.calls += 1
            if self.fail_after is not None and self.calls > self.fail_after:
                raise RuntimeError("a bug in the retriever path")
            self.out += 1
            self.most_out = max(self.most_out, self.out)
        try:
            time.sleep(self.rng.uniform(0.02, 0.08))
            return self.inner.post(path, body, timeout)
        finally:
            with self.lock:
                self.out -= 1

    def get(self, path, timeout):
        return self.inner.get(path, timeout)

    def close(self):
        pass


def rollout(tiny_model_dir, tiny_processor, tiny_llm, transport, mode):
    client = RetrieverClient(None, transport=transport, retries=0, max_concurrency=8)
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=2, rollout_mode=mode,
                       retriever_max_concurrency=4)
    return agent, agent.generate_sequences(prompt_batch(tiny_processor, sample_prompts(6), agent))


def test_several_batches_out_at_once_and_the_same_episodes(tiny_model_dir, tiny_processor, tiny_llm):
    synced = SlowRetriever()
    _, sync_out = rollout(tiny_model_dir, tiny_processor, tiny_llm, synced, "sync")
    continuous = SlowRetriever()
    _, cont_out = rollout(tiny_model_dir, tiny_processor, tiny_llm, continuous, "continuous")
    for key in ("responses", "loss_mask", "position_ids"):
        assert torch.equal(sync_out.batch[key], cont_out.batch[key]), key
    assert synced.most_out <= 2  # one search and one fetch request a turn
    assert continuous.most_out > 2  # batches from different engine steps overlap
    metrics = cont_out.meta_info["metrics"]
    assert 0 < metrics["rollout/engine_seconds"] <= metrics["rollout/seconds"]
    assert 0 < metrics["rollout/engine_busy_share"] <= 1
    assert metrics["rollout/sample_retriever_wait_seconds"] > 0
    assert metrics["rollout/loop_overhead_seconds"] >= 0


def test_an_error_aborts_every_engine_request_and_leaks_nothing(tiny_model_dir, tiny_processor, tiny_llm):
    with pytest.raises(RuntimeError, match="a bug in the retriever path"):
        rollout(tiny_model_dir, tiny_processor, tiny_llm, SlowRetriever(fail_after=1), "continuous")
    assert not tiny_llm.llm_engine.has_unfinished_requests()
    # The next call on the same engine runs normally.
    _, output = rollout(tiny_model_dir, tiny_processor, tiny_llm, SlowRetriever(), "continuous")
    assert output.meta_info["metrics"]["rollout/searches"] > 0
