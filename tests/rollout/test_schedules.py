"""The continuous schedule's own guarantees on the real engine: several retriever batches out at
once, identical episodes to the synchronized schedule under slow, jittered retrieval, every engine
request aborted when something raises, and where the time went."""

from __future__ import annotations

import pytest
import torch

from tests.rollout.agent_helpers import DelayedReplay, make_agent, prompt_batch, sample_prompts
from vrag_rollout.retriever_client import RetrieverClient


def rollout(tiny_model_dir, tiny_processor, tiny_llm, transport, mode):
    client = RetrieverClient(None, transport=transport, retries=0, max_concurrency=8)
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=2, rollout_mode=mode,
                       retriever_max_concurrency=4)
    return agent, agent.generate_sequences(prompt_batch(tiny_processor, sample_prompts(6), agent))


def test_several_batches_out_at_once_and_the_same_episodes(tiny_model_dir, tiny_processor, tiny_llm):
    synced = DelayedReplay(0.02, 0.08)
    _, sync_out = rollout(tiny_model_dir, tiny_processor, tiny_llm, synced, "sync")
    continuous = DelayedReplay(0.02, 0.08)
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
        rollout(tiny_model_dir, tiny_processor, tiny_llm, DelayedReplay(0.02, 0.08, fail_after=1), "continuous")
    assert not tiny_llm.llm_engine.has_unfinished_requests()
    # The next call on the same engine runs normally.
    _, output = rollout(tiny_model_dir, tiny_processor, tiny_llm, DelayedReplay(0.02, 0.08), "continuous")
    assert output.meta_info["metrics"]["rollout/searches"] > 0


def test_the_continuous_engine_only_builds_outputs_of_finished_requests(tiny_model_dir, tiny_llm):
    """vLLM's default output kind makes every step build each running request's output so far
    (tokens and logprobs): quadratic work the synchronized schedule's `LLM.generate` never does.
    A request mid-turn yields nothing; the finished one comes back whole."""
    from vllm import SamplingParams

    from vrag_rollout.engine import ContinuousEngine

    engine = ContinuousEngine(tiny_llm)
    params = SamplingParams(max_tokens=6, min_tokens=6, seed=1, logprobs=0, temperature=1.0)
    engine.submit("probe", {"prompt_token_ids": [1, 2, 3]}, params, "owner")
    outputs_mid_turn, finished = 0, []
    for _ in range(100):  # a few steps: the prefill, then one token a step
        if finished:
            break
        raw = engine._engine.step()
        outputs_mid_turn += sum(not out.finished for out in raw)
        finished += [out for out in raw if out.finished]
    assert outputs_mid_turn == 0 and len(finished) == 1
    assert len(finished[0].outputs[0].token_ids) == 6 and len(finished[0].outputs[0].logprobs) == 6
