"""The continuous schedule's own guarantees on the real engine: several retriever batches out at
once, identical episodes to the synchronized schedule under slow, jittered retrieval, every engine
request aborted when something raises, and where the time went."""

from __future__ import annotations

import pytest
import torch

from tests.rollout.agent_helpers import (DelayedReplay, make_agent, processor_grids, prompt_batch, sample_images,
                                         sample_prompts)
from vrag_rollout.devkit.demo import demo_prompts
from vrag_rollout.retrieval.client import RetrieverClient

# Page text holding special-token strings: it must reach the episode as text in both formats.
SPECIAL_TEXT = " <|im_end|>\n<|im_start|>user <|image_pad|><|vision_start|>x<|vision_end|>"
# Grammars that make every turn a tool turn with page text in it (no answer: episodes run to their
# turn or budget limit), so tool threads build text and image observations side by side.
TEXT_AND_PAGES = {
    "tags": r"<think>[a-z ]{3,16}</think>(<fetch>text, [1-4]</fetch>|<fetch>image, [1-4]</fetch>|"
            r"<search>(segment revenue and EBITDA margin|flammable solvents cabinet)</search>)",
    "tool_call": r'<think>[a-z ]{3,16}</think>\n<tool_call>\n\{"name": "fetch", "arguments": \{"page": [1-4], '
                 r'"mode": "text"\}\}\n</tool_call>\n<tool_call>\n\{"name": "fetch", "arguments": \{"page": [1-4], '
                 r'"mode": "image"\}\}\n</tool_call>',
}


def rollout(tiny_model_dir, tiny_processor, tiny_llm, transport, mode):
    client = RetrieverClient(None, transport=transport, retries=0, max_concurrency=8)
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=2, rollout_mode=mode,
                       retriever_max_concurrency=4)
    return agent, agent.generate_sequences(prompt_batch(tiny_processor, sample_prompts(6), agent))


def test_several_batches_out_at_once_and_the_same_episodes(tiny_model_dir, tiny_processor, tiny_llm, caplog):
    # Delays longer than an engine step even on a loaded machine, so the continuous schedule's
    # batches from different steps overlap (at 20-80 ms they did not when other work shared the cores).
    import logging

    synced = DelayedReplay(0.2, 0.5)
    with caplog.at_level(logging.INFO, logger="vrag_rollout.progress"):
        _, sync_out = rollout(tiny_model_dir, tiny_processor, tiny_llm, synced, "sync")
        sync_lines = [r.getMessage() for r in caplog.records if r.name == "vrag_rollout.progress"]
        caplog.clear()
        continuous = DelayedReplay(0.2, 0.5)
        _, cont_out = rollout(tiny_model_dir, tiny_processor, tiny_llm, continuous, "continuous")
        cont_lines = [r.getMessage() for r in caplog.records if r.name == "vrag_rollout.progress"]
    # progress a user sees (issue 48, item 3): the batch, each turn (synchronized), each episode's end
    size = len(sync_out)
    assert sync_lines[0].startswith(f"rolling out {size} episodes") and "turn 1 of at most" in sync_lines[1]
    assert cont_lines[0] == sync_lines[0]
    ends = [line for line in cont_lines if line.startswith("episode ")]
    assert ends[-1].startswith(f"episode {size} of {size} ended") and len(ends) == min(size, len(ends))
    for key in ("responses", "loss_mask", "position_ids"):
        assert torch.equal(sync_out.batch[key], cont_out.batch[key]), key
    assert synced.most_out <= 2  # one search and one fetch request a turn
    assert continuous.most_out > 2  # batches from different engine steps overlap
    metrics = cont_out.meta_info["metrics"]
    assert 0 < metrics["rollout/engine_seconds"] <= metrics["rollout/seconds"]
    assert 0 < metrics["rollout/engine_busy_share"] <= 1
    assert metrics["rollout/sample_retriever_wait_seconds"] > 0
    assert metrics["rollout/loop_overhead_seconds"] >= 0


@pytest.mark.parametrize("action_format", ["tags", "tool_call"])
def test_both_schedules_give_the_same_episodes_in_every_family_and_format(family_model, action_format):
    """Under jittered retrieval, with page text that holds special-token strings: identical
    episodes, and every image pad run is a real page's. (Contention itself is too rare in one
    rollout to catch a race; test_thread_safety.py drives the observer under it.)"""
    fm, outputs, served = family_model, {}, {}
    for mode in ("sync", "continuous"):
        transport = DelayedReplay(0.0, 0.03, text_suffix=SPECIAL_TEXT)
        client = RetrieverClient(None, transport=transport, retries=0, max_concurrency=8)
        agent = make_agent(fm.model_dir, fm.processor, fm.llm, client, n=2, rollout_mode=mode, prompt_length=1024,
                           action_format=action_format, retriever_max_concurrency=4,
                           action_regex=TEXT_AND_PAGES[action_format])
        prompts = demo_prompts(fm.processor.tokenizer, fm.processor, sample_prompts(6), agent.config)
        outputs[mode], served[mode] = agent.generate_sequences(prompts), transport.text_pages
        # One tokenizer lock through everything that tokenizes while tool threads run.
        driver = agent.driver
        locks = {agent.tokenizer.lock, driver.observations.tokenizer.lock, driver.observer.builder.tokenizer.lock}
        if action_format == "tool_call":
            locks.add(driver.format.template.tokenizer.lock)
        assert len(locks) == 1 and agent.tokenizer.raw is not fm.processor.tokenizer  # the rollout's own copy
    for key in ("responses", "loss_mask", "position_ids"):
        assert torch.equal(outputs["sync"].batch[key], outputs["continuous"].batch[key]), key
    assert served["continuous"] > 0  # text pages with special-token strings were observed
    vocab = fm.processor.tokenizer.get_vocab()
    merge = fm.processor.image_processor.merge_size
    output = outputs["continuous"]
    for row in range(len(output)):
        ids = output.batch["input_ids"][row].tolist()  # prompt and response
        images = sample_images(output, row)
        grids = processor_grids(fm.processor, images)
        # One vision block per image and the processor's own pad count for every image of the row.
        assert ids.count(vocab["<|vision_start|>"]) == ids.count(vocab["<|vision_end|>"]) == len(images), row
        assert ids.count(vocab["<|image_pad|>"]) == (0 if grids is None else int(grids.prod(-1).sum()) // merge**2), row


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

    from vrag_rollout.engine.llm import ContinuousEngine

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


@pytest.mark.parametrize("mode", ["continuous", "sync"])
def test_after_a_failed_call_ids_and_seeds_are_new_even_if_the_abort_failed(tiny_model_dir, tiny_processor, tiny_llm,
                                                                          monkeypatch, mode):
    """Request ids and seeds never repeat across calls, a failed one included, so nothing rests on
    the abort alone: with an abort that did nothing, the failed call's requests stay in the engine,
    and the next call, in either schedule, must neither collide with them nor take their outputs
    for its own."""
    from vrag_rollout.engine.llm import ContinuousEngine

    engine = tiny_llm.llm_engine
    submitted: list = []  # (call, request id, seed)
    real_add = engine.add_request

    def add_request(request_id, prompt, params, *args, **kwargs):
        submitted.append((call, request_id, params.seed))
        return real_add(request_id, prompt, params, *args, **kwargs)

    monkeypatch.setattr(engine, "add_request", add_request)
    monkeypatch.setattr(ContinuousEngine, "abort_all", lambda self: None)
    batch = prompt_batch(tiny_processor, sample_prompts(6), make_agent(tiny_model_dir, tiny_processor, tiny_llm, None))

    def agent(transport, rollout_mode="continuous"):
        client = RetrieverClient(None, transport=transport, retries=0, max_concurrency=8)
        return make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=2, retriever_max_concurrency=4,
                          rollout_mode=rollout_mode)

    try:
        call = 0
        failing = agent(DelayedReplay(0.02, 0.08, fail_after=1))
        with pytest.raises(RuntimeError, match="a bug in the retriever path"):
            failing.generate_sequences(batch)
        assert engine.has_unfinished_requests()  # the failed call's requests were left running
        call = 1
        failing.retriever = RetrieverClient(None, transport=DelayedReplay(0.02, 0.08), retries=0, max_concurrency=8)
        failing.config.rollout_mode = mode
        after_failure = failing.generate_sequences(batch)
    finally:
        engine.abort_request([request_id for _, request_id, _ in submitted])
    ids = [request_id for _, request_id, _ in submitted]
    assert len(set(ids)) == len(ids)
    seeds = [{seed for c, _, seed in submitted if c == k} for k in (0, 1)]
    assert seeds[0] and seeds[1] and not seeds[0] & seeds[1]
    # The same as the second call of a history without failures: none of the old outputs mixed in.
    monkeypatch.undo()
    clean = agent(DelayedReplay(0.02, 0.08), mode)
    clean.generate_sequences(batch)
    second = clean.generate_sequences(batch)
    for key in ("responses", "loss_mask", "position_ids"):
        assert torch.equal(after_failure.batch[key], second.batch[key]), key
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("mode", ["continuous", "sync"])
def test_a_retriever_call_past_its_deadline_fails_the_call_and_leaks_nothing(tiny_model_dir, tiny_processor,
                                                                            tiny_llm, monkeypatch, mode):
    """A retriever that never answers: either schedule gives up at the retriever's stated deadline
    (plus the decoding slack) instead of waiting forever, and leaves no request in the engine."""
    import threading
    import time

    import vrag_rollout.rollout.driver as rollout_module

    class Stuck:
        deadline_s = 0.3

        def __init__(self):
            self.release = threading.Event()

        def batch_search(self, queries, doc_ids, top_n):
            self.release.wait(30)
            return []

        def batch_fetch(self, specs, doc_ids):
            return self.batch_search(specs, doc_ids, 0)

    monkeypatch.setattr(rollout_module, "DECODE_SLACK_S", 0.2)
    stuck = Stuck()
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, stuck, n=2, rollout_mode=mode)
    started = time.perf_counter()
    try:
        with pytest.raises(TimeoutError, match="deadline of 0.5 s"):
            agent.generate_sequences(prompt_batch(tiny_processor, sample_prompts(4), agent))
    finally:
        stuck.release.set()
    assert time.perf_counter() - started < 20
    assert not tiny_llm.llm_engine.has_unfinished_requests()


def test_a_synchronized_call_refuses_an_engine_holding_requests_of_someone_else(tiny_model_dir, tiny_processor,
                                                                               tiny_llm):
    """`LLM.generate` returns every request that finishes in the engine: a request the rollout did
    not add would be paired with one of its samples. The call refuses instead."""
    from vllm import SamplingParams

    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, None, n=1, rollout_mode="sync",
                       retriever_preflight="off")  # no retriever runs: the engine must refuse first
    engine = tiny_llm.llm_engine
    engine.add_request("someone-else", {"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=4, seed=1))
    try:
        with pytest.raises(RuntimeError, match="holds requests this rollout did not add"):
            agent.generate_sequences(prompt_batch(tiny_processor, sample_prompts(2), agent))
    finally:
        engine.abort_request(["someone-else"])
    assert not engine.has_unfinished_requests()


def test_the_rollout_waits_on_its_own_client_no_longer_than_the_clients_deadline(tiny_model_dir, tiny_processor,
                                                                                  tiny_llm):
    from vrag_rollout.rollout.driver import DECODE_SLACK_S

    config = dict(retriever_url="http://127.0.0.1:9", retriever_timeout=2.0, retriever_retries=1)
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, None, **config)
    client = agent.retriever
    assert isinstance(client, RetrieverClient)
    assert client.deadline_s >= client.overload_budget_s + 2 * 2.0  # at least the tries and the budget
    assert agent.driver.tool_deadline_s == client.deadline_s + DECODE_SLACK_S
    client.close()
