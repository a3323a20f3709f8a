"""Retriever faults and tight budgets on the real engine: the batch always completes, cleanly."""

from __future__ import annotations

import socket

import pytest
import torch

from tests.rollout.agent_helpers import make_agent, processor_grids, prompt_batch, sample_images, sample_prompts
from vrag_rollout.retrieval.client import RetrieverClient


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens here once the socket closes


class GarbageImages:
    """A retriever that answers every call, with page images that are not images."""

    def post(self, path, body, timeout):
        if path == "/batch_search":
            return [[{"id": f"{doc}_1", "contents": "not-an-image!!"}] for doc in body["id"]]
        return [{"id": spec, "contents": "R0lGODlhAQABAIAAAP"} for spec in body["query"]]  # truncated GIF

    def get(self, path, timeout):
        return {"status": "ok"}

    def close(self):
        pass


def responses_text(output, tokenizer, row):
    used = int(output.batch["response_mask"][row].sum())
    return tokenizer.decode(output.batch["responses"][row][:used].tolist())


def assert_images_whole(output, processor):
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for row in range(len(output)):
        images = sample_images(output, row)
        pads = int((output.batch["input_ids"][row][output.batch["attention_mask"][row].bool()] == image_pad).sum())
        grids = processor_grids(processor, images)
        expected = 0 if grids is None else int(grids.prod(dim=-1).sum()) // processor.image_processor.merge_size**2
        assert pads == expected, f"sample {row}"


def test_retriever_down_gives_error_observations(tiny_model_dir, tiny_processor, tiny_llm):
    """Down from the start, with the preflight off (it would refuse the batch: test_preflight.py),
    as a retriever that dies after the preflight looks to the episodes."""
    client = RetrieverClient(f"http://127.0.0.1:{closed_port()}", timeout=1.0, retries=1, backoff=0.01)
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=2, max_turns=3, retriever_preflight="off")
    output = agent.generate_sequences(prompt_batch(tiny_processor, sample_prompts(4, with_images=False), agent))
    metrics = output.meta_info["metrics"]
    tool_calls = metrics["rollout/searches"] + metrics["rollout/fetches"]
    assert tool_calls > 0
    assert metrics["rollout/retriever_errors"] == tool_calls
    assert metrics["retriever/failures/connection"] == tool_calls
    assert metrics["rollout/images_retrieved"] == 0
    for row in range(len(output)):
        calls = output.non_tensor_batch["num_searches"][row] + output.non_tensor_batch["num_fetches"][row]
        text = responses_text(output, tiny_processor.tokenizer, row)
        assert text.count("<result>error:") == calls
        assert output.non_tensor_batch["retriever_errors"][row] == calls  # each sample's failed calls
        assert output.non_tensor_batch["bad_requests"][row] == 0
    assert_images_whole(output, tiny_processor)


def test_undecodable_images_become_error_observations(tiny_model_dir, tiny_processor, tiny_llm):
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, RetrieverClient(None, transport=GarbageImages()),
                       n=2, max_turns=3, fetch_modes=("image",))
    output = agent.generate_sequences(prompt_batch(tiny_processor, sample_prompts(4, with_images=False), agent))
    metrics = output.meta_info["metrics"]
    assert metrics["rollout/searches"] + metrics["rollout/fetches"] > 0
    assert metrics["rollout/retriever_errors"] == metrics["rollout/searches"] + metrics["rollout/fetches"]
    assert metrics["rollout/pages_undecodable"] == metrics["rollout/searches"] + metrics["rollout/fetches"]
    texts = [responses_text(output, tiny_processor.tokenizer, row) for row in range(len(output))]
    assert any("could not be decoded" in text for text in texts)
    assert_images_whole(output, tiny_processor)


@pytest.mark.parametrize("response_length", [96, 144])  # each overflows with some page on the tiny model
def test_tight_budget_admits_images_whole_or_ends_the_sample(tiny_model_dir, tiny_processor, tiny_llm, response_length):
    from tests.conftest import SAMPLE_RETRIEVAL
    from vrag_rollout.retrieval.fixtures import FixtureTransport

    client = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=2, response_length=response_length,
                       page_min_pixels=48 * 28 * 28, page_max_pixels=64 * 28 * 28)
    output = agent.generate_sequences(prompt_batch(tiny_processor, sample_prompts(6, with_images=False), agent))
    assert output.batch["responses"].shape[1] == response_length
    assert int(output.batch["response_mask"].sum(-1).max()) <= response_length
    reasons = list(output.non_tensor_batch["termination_reason"])
    metrics = output.meta_info["metrics"]
    assert "budget" in reasons or metrics["rollout/images_dropped_budget"] > 0
    assert metrics["rollout/truncated"] == reasons.count("budget") + reasons.count("length")
    assert_images_whole(output, tiny_processor)
    overflows = output.non_tensor_batch["budget_overflow"]
    lengths = output.batch["attention_mask"][:, -response_length:].sum(-1).tolist()
    for reason, overflow, length in zip(reasons, overflows, lengths):
        if overflow is None:  # a budget ending without one: the last observation filled it exactly
            assert reason != "budget" or length == response_length
            continue
        assert reason == "budget"
        assert overflow["remaining"] == response_length - length < overflow["tokens"]
        assert overflow["turn"] >= 1 and all(page.startswith(("product_guide", "annual_report", "safety_manual"))
                                             for page in overflow["page_ids"])
    assert any(overflow is not None for overflow in overflows)
    for row in range(len(output)):  # the text row still strictly increases through the padding
        assert torch.all(torch.diff(output.batch["position_ids"][row, 0][output.batch["attention_mask"][row].argmax():]) == 1)


class FaultyTransport:
    """Answers every call with one kind of fault, as the HTTP transport reports it."""

    def __init__(self, fault):
        self.fault = fault

    def post(self, path, body, timeout):
        from vrag_rollout.retrieval.client import TransportHTTPError, TransportTimeout

        if self.fault == "timeout":
            raise TransportTimeout("retriever timed out after 3 tries")
        if self.fault == "http_500":
            raise TransportHTTPError(500, "retriever answered HTTP 500 after 3 tries")
        if self.fault == "malformed":
            return {"unexpected": "shape"}
        return [[]] * 3  # a list of the wrong length

    def get(self, path, timeout):
        return {}

    def close(self):
        pass


@pytest.mark.parametrize(
    "fault, kind",
    [("timeout", "timeout"), ("http_500", "http"), ("malformed", "malformed"), ("wrong_length", "malformed")],
)
def test_each_fault_kind_becomes_an_error_observation(tiny_model_dir, tiny_processor, tiny_llm, fault, kind):
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, RetrieverClient(None, transport=FaultyTransport(fault)),
                       n=2, max_turns=2)
    output = agent.generate_sequences(prompt_batch(tiny_processor, sample_prompts(4, with_images=False), agent))
    metrics = output.meta_info["metrics"]
    calls = metrics["rollout/searches"] + metrics["rollout/fetches"]
    assert calls > 0
    assert metrics[f"retriever/failures/{kind}"] == calls == metrics["rollout/retriever_errors"]
    errors = sum(responses_text(output, tiny_processor.tokenizer, row).count("<result>error:") for row in range(len(output)))
    assert errors == calls


def test_invalid_actions_get_a_correction_and_the_sample_goes_on_in_both_schedules(
    tiny_model_dir, tiny_processor, tiny_llm
):
    from tests.conftest import SAMPLE_RETRIEVAL
    from vrag_rollout.retrieval.fixtures import FixtureTransport

    outputs = {}
    for mode in ("sync", "continuous"):
        client = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
        # the grammar still lets the policy write <fetch>text, N</fetch>: now an invalid action
        agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=2, fetch_modes=("image",),
                           rollout_mode=mode)
        outputs[mode] = agent.generate_sequences(prompt_batch(tiny_processor, sample_prompts(6, with_images=False), agent))
    sync, continuous = outputs["sync"], outputs["continuous"]
    assert sync.meta_info["metrics"]["rollout/invalid_actions"] > 0
    texts = [responses_text(sync, tiny_processor.tokenizer, row) for row in range(len(sync))]
    corrected = [t for t in texts if "fetch modality 'text' is not available" in t]
    assert corrected and any(t.rfind("</result>") < t.rfind("<think>") for t in corrected)  # it went on
    assert torch.equal(sync.batch["responses"], continuous.batch["responses"])
    assert sync.meta_info["metrics"]["rollout/invalid_actions"] == continuous.meta_info["metrics"]["rollout/invalid_actions"]


def test_batches_larger_than_one_engine_step_complete(tiny_model_dir, tiny_processor, tiny_llm):
    """48 seeded episodes exceed one engine step's token budget (4096): on CPU a prefill split
    across steps crashed vLLM's seeded sampling ("CPU Generator does not use offset")."""
    from tests.conftest import SAMPLE_RETRIEVAL
    from vrag_rollout.retrieval.fixtures import FixtureTransport

    client = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=4)
    prompts = prompt_batch(tiny_processor, (sample_prompts(13, with_images=False) * 2)[:12], agent)
    assert int(prompts.batch["attention_mask"].sum()) * 4 > 4096
    output = agent.generate_sequences(prompts)
    assert output.batch["responses"].shape[0] == 48
    assert output.meta_info["metrics"]["rollout/searches"] > 0
    assert_images_whole(output, tiny_processor)
