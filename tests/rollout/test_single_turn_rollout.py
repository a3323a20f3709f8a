"""vLLMRollout (single turn, EasyR1 semantics): n samples, seeds, sampling overrides, logprobs."""

from __future__ import annotations

import torch

from tests.rollout.agent_helpers import prompt_batch, sample_prompts
from vrag_rollout import AgentRolloutConfig, vLLMRollout


def make_rollout(model_dir, processor, llm, **overrides):
    config = AgentRolloutConfig(**{"n": 3, "seed": 7, "prompt_length": 384, "response_length": 48, **overrides})
    return vLLMRollout(str(model_dir), config, processor.tokenizer, processor, inference_engine=llm)


def test_shapes_masks_and_distinct_samples(tiny_model_dir, tiny_processor, tiny_llm):
    rollout = make_rollout(tiny_model_dir, tiny_processor, tiny_llm)
    prompts = prompt_batch(tiny_processor, sample_prompts(3), rollout)
    output = rollout.generate_sequences(prompts)
    assert output.batch["responses"].shape == (9, 48)
    assert torch.equal(output.batch["loss_mask"], output.batch["response_mask"])  # no observations
    for group in range(3):
        rows = output.batch["responses"][group * 3 : group * 3 + 3]
        assert len({tuple(row.tolist()) for row in rows}) == 3, "the n samples of a prompt are identical"
    banned = {tiny_processor.tokenizer.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|vision_start|>")}
    assert not banned & set(output.batch["responses"][output.batch["response_mask"].bool()].tolist())


def test_fixed_seed_reproduces_and_greedy_override_collapses_samples(tiny_model_dir, tiny_processor, tiny_llm):
    first = make_rollout(tiny_model_dir, tiny_processor, tiny_llm)
    second = make_rollout(tiny_model_dir, tiny_processor, tiny_llm)
    prompts = prompt_batch(tiny_processor, sample_prompts(2), first)
    assert torch.equal(first.generate_sequences(prompts).batch["responses"],
                       second.generate_sequences(prompts).batch["responses"])

    # EasyR1 passes meta_info as sampling overrides for one call (e.g. greedy for validation).
    greedy_prompts = prompt_batch(tiny_processor, sample_prompts(2), first, meta_info={"temperature": 0.0})
    greedy = first.generate_sequences(greedy_prompts).batch["responses"]
    assert torch.equal(greedy[0], greedy[1]) and torch.equal(greedy[1], greedy[2])
    assert first.driver.sampling.base["temperature"] == 1.0  # restored after the call
    one = prompt_batch(tiny_processor, sample_prompts(2), first, meta_info={"n": 1})
    assert first.generate_sequences(one).batch["responses"].shape[0] == 2


def test_logprobs_sit_on_sampled_tokens_only(tiny_model_dir, tiny_processor, tiny_llm):
    rollout = make_rollout(tiny_model_dir, tiny_processor, tiny_llm, n=1, calculate_log_probs=True)
    output = rollout.generate_sequences(prompt_batch(tiny_processor, sample_prompts(2), rollout))
    logprobs, mask = output.batch["rollout_log_probs"], output.batch["loss_mask"].bool()
    assert torch.all(logprobs[mask] <= 0) and torch.any(logprobs[mask] < 0)
    assert torch.all(logprobs[~mask] == 0)



def test_data_parallel_ranks_sample_the_same_prompt_differently(tiny_model_dir, tiny_processor, tiny_llm):
    """Sample indices are shard-local: without the rank in the seed, the same prompt on two
    data-parallel ranks would get the same noise."""
    outputs = {}
    for name, rank in (("rank0", 0), ("rank1", 1), ("rank1_again", 1)):
        config = AgentRolloutConfig(n=2, seed=7, prompt_length=384, response_length=32)
        rollout = vLLMRollout(str(tiny_model_dir), config, tiny_processor.tokenizer, tiny_processor,
                              inference_engine=tiny_llm, data_parallel_rank=rank)
        outputs[name] = rollout.generate_sequences(prompt_batch(tiny_processor, sample_prompts(2), rollout))
    responses = {name: out.batch["responses"] for name, out in outputs.items()}
    assert torch.equal(responses["rank1"], responses["rank1_again"])
    for row in range(4):
        assert not torch.equal(responses["rank0"][row], responses["rank1"][row]), f"row {row}"


def test_the_data_parallel_rank_comes_from_torch_distributed(tiny_model_dir, tiny_processor, tiny_llm, monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 5)
    config = AgentRolloutConfig(prompt_length=384, response_length=32, tensor_parallel_size=2)
    rollout = vLLMRollout(str(tiny_model_dir), config, tiny_processor.tokenizer, tiny_processor, inference_engine=tiny_llm)
    assert rollout.driver.dp_rank == 2  # global rank 5 in TP groups of 2: {0,1} {2,3} {4,5}
