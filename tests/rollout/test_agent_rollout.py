"""End to end, for every model family: real vLLM, the family's tiny model, retrieval replayed
from the recorded fixture.

One rollout per family (module fixture, parametrized) is checked from every side: the EasyR1
output contract, the real verl DataProto round trip, and two independent oracles (the family's own
transformers get_rope_index for the position ids, the processor's feature count for the image
tokens).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from tests.conftest import SAMPLE_RETRIEVAL
from tests.rollout.agent_helpers import (
    DelayedReplay,
    hf_rope_index,
    make_agent,
    processor_grids,
    prompt_batch,
    sample_images,
    sample_prompts,
)
from vrag_rollout.retrieval.fixtures import FixtureTransport
from vrag_rollout.retrieval.client import RetrieverClient

# The trainer-side DataProto is part of the test extra: a missing one fails here, never skips.
import verl.protocol as verl_protocol  # noqa: E402
N = 2
BATCH = 6


@pytest.fixture(scope="module")
def rollout(family_model):
    retriever = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
    fm = family_model
    agent = make_agent(fm.model_dir, fm.processor, fm.llm, retriever, n=N)
    assert agent.family.name == fm.family
    prompts = prompt_batch(fm.processor, sample_prompts(BATCH), agent, proto_cls=verl_protocol.DataProto)
    trainer_view = prompts.non_tensor_batch["doc_id"].copy()
    output = agent.generate_sequences(prompts)
    return agent, prompts, output, trainer_view


def test_output_contract(rollout):
    agent, prompts, output, _ = rollout
    batch = output.batch
    size, prompt_len, resp_len = BATCH * N, prompts.batch["input_ids"].shape[1], agent.config.response_length
    assert type(output) is verl_protocol.DataProto
    assert batch["responses"].shape == (size, resp_len)
    assert batch["prompts"].shape == (size, prompt_len)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (size, prompt_len + resp_len)
    assert batch["position_ids"].shape == (size, 4, prompt_len + resp_len)
    assert torch.equal(batch["prompts"], prompts.batch["input_ids"].repeat_interleave(N, dim=0))
    assert torch.equal(batch["input_ids"], torch.cat([batch["prompts"], batch["responses"]], dim=-1))
    prompt_mask = prompts.batch["attention_mask"].repeat_interleave(N, dim=0)
    assert torch.equal(batch["attention_mask"], torch.cat([prompt_mask, batch["response_mask"]], dim=-1))
    assert batch["response_mask"].dtype == prompt_mask.dtype
    for row in range(size):
        mask = batch["response_mask"][row]
        used = int(mask.sum())
        assert torch.all(mask[:used] == 1) and torch.all(mask[used:] == 0)  # one contiguous run
        assert torch.all(batch["loss_mask"][row] <= mask)
        reason = output.non_tensor_batch["termination_reason"][row]
        eos_ids = {agent.tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
        if reason in ("answered", "eos"):
            assert int(batch["responses"][row, used - 1]) in eos_ids  # 1 through the EOS
    assert set(output.non_tensor_batch["termination_reason"]) <= {"answered", "eos", "length", "budget", "max_turns"}
    assert list(output.non_tensor_batch["doc_id"]) == list(np.repeat(prompts.non_tensor_batch["doc_id"], N))


def test_episodes_really_search_and_fetch(rollout, family_model):
    _, _, output, _ = rollout
    tokenizer = family_model.processor.tokenizer
    metrics = output.meta_info["metrics"]
    assert metrics["rollout/searches"] > 0 and metrics["rollout/fetches"] > 0
    assert metrics["rollout/images_retrieved"] > 0
    assert metrics["rollout/turns_max"] > 1
    pages = [page for row in output.non_tensor_batch["page_ids"] for turn in row for page in turn]
    docs = output.non_tensor_batch["doc_id"]
    for row, turns in enumerate(output.non_tensor_batch["page_ids"]):
        for turn in turns:
            assert all(page.startswith(docs[row] + "_") for page in turn)  # searched its own document
    assert pages
    # Counted from the tokens themselves: an executed call is one followed by its result block.
    for row in range(len(output)):
        used = int(output.batch["response_mask"][row].sum())
        text = tokenizer.decode(output.batch["responses"][row][:used].tolist())
        assert output.non_tensor_batch["num_searches"][row] == text.count("</search><result>"), row
        assert output.non_tensor_batch["num_fetches"][row] == text.count("</fetch><result>"), row


def test_mrope_rows_equal_transformers_get_rope_index(rollout, family_model):
    _, _, output, _ = rollout
    tiny_processor, tiny_model_dir = family_model.processor, family_model.model_dir
    batch = output.batch
    for row in range(len(output)):
        mask = batch["attention_mask"][row]
        valid = mask.bool()
        grids = processor_grids(tiny_processor, sample_images(output, row))
        expected = hf_rope_index(tiny_processor, tiny_model_dir, batch["input_ids"][row], mask, grids)
        got = batch["position_ids"][row]
        assert torch.equal(got[1:, valid], expected[:, valid]), f"sample {row}"
        text_row = got[0, valid]
        assert torch.equal(text_row, torch.arange(int(valid.sum())))  # strictly increasing from 0
        assert torch.all(torch.diff(got[0, int(valid.nonzero()[0]) :]) == 1)  # padding continues too


def test_image_features_equal_image_pad_tokens(rollout, family_model):
    _, _, output, _ = rollout
    tiny_processor = family_model.processor
    image_pad = tiny_processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    merge = tiny_processor.image_processor.merge_size
    saw_retrieved = False
    for row in range(len(output)):
        images = sample_images(output, row)
        valid = output.batch["attention_mask"][row].bool()
        pads = int((output.batch["input_ids"][row][valid] == image_pad).sum())
        if not images:
            assert pads == 0
            continue
        features = tiny_processor.image_processor(images=images, return_tensors="pt")["pixel_values"].shape[0]
        assert pads == features // merge**2, f"sample {row}"
        saw_retrieved |= int((output.batch["responses"][row] == image_pad).sum()) > 0
    assert saw_retrieved


def test_observation_tokens_carry_no_loss(rollout, family_model):
    _, _, output, _ = rollout
    tiny_processor = family_model.processor
    tokenizer = tiny_processor.tokenizer
    vision = {tokenizer.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")}
    for row in range(len(output)):
        responses, loss = output.batch["responses"][row], output.batch["loss_mask"][row]
        for token, flag in zip(responses.tolist(), loss.tolist()):
            if token in vision:
                assert flag == 0
        # every masked run is exactly one <result>…</result> block
        used = int(output.batch["response_mask"][row].sum())
        runs, current = [], []
        for token, flag in zip(responses[:used].tolist(), loss[:used].tolist()):
            if flag == 0:
                current.append(token)
            elif current:
                runs.append(current)
                current = []
        if current:
            runs.append(current)
        for run in runs:
            text = tokenizer.decode(run)
            assert text.startswith("<result>") and text.endswith("</result>"), text[:80]
        sampled = tokenizer.decode(responses[:used][loss[:used].bool()].tolist())
        assert "<think>" in sampled  # the policy's own tokens, as sampled under the grammar


def test_n_samples_of_a_prompt_differ(rollout):
    _, _, output, _ = rollout
    responses = output.batch["responses"]
    for group in range(BATCH):
        first, second = responses[group * N], responses[group * N + 1]
        assert not torch.equal(first, second), f"prompt {group}: identical samples"


def test_union_with_the_trainers_batch(rollout):
    """The trainer does batch.repeat(n, interleave=True).union(output) with the real DataProto."""
    _, prompts, output, doc_ids = rollout
    # After popping the generation inputs the trainer's batch has no tensors left, only rows.
    trainer = verl_protocol.DataProto(
        batch=TensorDict({}, batch_size=[BATCH]),
        non_tensor_batch={"uid": np.array([f"u{i}" for i in range(BATCH)], dtype=object), "doc_id": doc_ids},
    )
    merged = trainer.repeat(repeat_times=N, interleave=True).union(output)
    assert len(merged) == BATCH * N
    assert list(merged.non_tensor_batch["uid"]) == [f"u{i // N}" for i in range(BATCH * N)]
    assert torch.equal(merged.batch["responses"], output.batch["responses"])


@pytest.fixture(scope="session")
def live_index(tmp_path_factory):
    """The sample corpus indexed from scratch, once per session."""
    from vrag_rollout.devkit.demo import prepare_index

    return prepare_index(tmp_path_factory.mktemp("live-retriever"))


def test_live_server_reproduces_the_recorded_rollout(rollout, family_model, live_index):
    """The same rollout against the real retriever server, on an index built from scratch,
    equals the replayed one: the fixture file is a faithful, current recording."""
    from retriever_server.api.testing import serve_in_thread

    _, _, replayed, _ = rollout
    fm = family_model
    with serve_in_thread(live_index) as url, RetrieverClient(url) as client:
        agent = make_agent(fm.model_dir, fm.processor, fm.llm, client, n=N)
        prompts = prompt_batch(fm.processor, sample_prompts(BATCH), agent, proto_cls=verl_protocol.DataProto)
        live = agent.generate_sequences(prompts)
        assert live.meta_info["metrics"]["retriever/calls"] > 0
    assert torch.equal(live.batch["responses"], replayed.batch["responses"])
    assert torch.equal(live.batch["position_ids"], replayed.batch["position_ids"])
    assert [list(p) for p in live.non_tensor_batch["page_ids"]] == [list(p) for p in replayed.non_tensor_batch["page_ids"]]


def test_continuous_schedule_gives_the_same_episodes(rollout, family_model):
    """Continuous batching changes when each sample runs, not what it samples: per-sample seeds
    make the episodes identical to the turn-synchronized ones, whatever the retriever's latency
    (here random, 0 to 30 ms a call, so results come back at varying engine steps)."""
    _, _, replayed, _ = rollout
    fm = family_model
    client = RetrieverClient(None, transport=DelayedReplay())
    agent = make_agent(fm.model_dir, fm.processor, fm.llm, client, n=N, rollout_mode="continuous")
    prompts = prompt_batch(fm.processor, sample_prompts(BATCH), agent, proto_cls=verl_protocol.DataProto)
    continuous = agent.generate_sequences(prompts)
    for key in ("responses", "loss_mask", "position_ids", "attention_mask"):
        assert torch.equal(continuous.batch[key], replayed.batch[key]), key
    assert list(continuous.non_tensor_batch["termination_reason"]) == list(replayed.non_tensor_batch["termination_reason"])
    assert continuous.meta_info["metrics"]["rollout/searches"] == replayed.meta_info["metrics"]["rollout/searches"]
