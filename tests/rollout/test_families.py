"""Every supported model family, beyond the shared end-to-end proof in test_agent_rollout.py:
family detection and refusal, the tiny builders' family-specific parts, and rollout logprobs
against a transformers forward pass of the same batch (the independent oracle)."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig, AutoModelForImageTextToText

from tests.conftest import SAMPLE_RETRIEVAL
from tests.rollout.agent_helpers import make_agent, prompt_batch, sample_images, sample_prompts
from vrag_rollout import AgentRolloutConfig, vLLMRolloutAgent
from vrag_rollout.rollout.driver import EpisodeDriver
from vrag_rollout.families import FAMILY_NAMES, UnsupportedModelError, detect_family, family_by_name
from vrag_rollout.retrieval.fixtures import FixtureTransport
from vrag_rollout.retrieval.client import RetrieverClient
from vrag_rollout.devkit.tiny_model import build_tiny_model

# What each family's released checkpoint has, written out independently of the builders.
EXPECTED = {
    "qwen2-vl": dict(model_type="qwen2_vl", processor="Qwen2VLProcessor", patch=14, system_turn=True),
    "qwen2.5-vl": dict(model_type="qwen2_5_vl", processor="Qwen2_5_VLProcessor", patch=14, system_turn=True),
    "qwen3-vl": dict(model_type="qwen3_vl", processor="Qwen3VLProcessor", patch=16, system_turn=False),
}


def test_every_family_is_covered():
    assert set(FAMILY_NAMES) == set(EXPECTED)


def test_tiny_model_is_its_familys_own(family_model):
    expected = EXPECTED[family_model.family]
    config = AutoConfig.from_pretrained(family_model.model_dir)
    processor = family_model.processor
    assert config.model_type == expected["model_type"]
    assert type(processor).__name__ == expected["processor"]
    assert processor.image_processor.patch_size == config.vision_config.patch_size == expected["patch"]
    assert processor.image_processor.merge_size == config.vision_config.spatial_merge_size == 2
    text_config = config.text_config
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    assert head_dim == 32  # vLLM's CPU attention refuses 16
    assert sum(text_config.rope_parameters["mrope_section"]) == head_dim // 2
    tokenizer = processor.tokenizer
    assert len(tokenizer) < text_config.vocab_size  # padded, as in the released checkpoints
    for name, token in (("image_token_id", "<|image_pad|>"), ("vision_start_token_id", "<|vision_start|>"),
                        ("vision_end_token_id", "<|vision_end|>")):
        assert getattr(config, name) == tokenizer.convert_tokens_to_ids(token)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "which page?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\n") == expected["system_turn"]
    assert "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>which page?<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert detect_family(family_model.model_dir, processor).name == family_model.family


def test_tiny_builds_are_deterministic(tmp_path, family_model):
    rebuilt = build_tiny_model(tmp_path / "again", family_model.family)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "processor_config.json"):
        assert (rebuilt / name).read_bytes() == (family_model.model_dir / name).read_bytes(), name


def _copy_with_model_type(src, dst, model_type):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["model_type"] = model_type
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_unsupported_model_fails_at_construction_naming_the_families(tiny_model_dir, tiny_processor, tmp_path):
    other = _copy_with_model_type(tiny_model_dir, tmp_path / "llava", "llava")
    config = AgentRolloutConfig(prompt_length=64, response_length=64)
    with pytest.raises(UnsupportedModelError) as caught:
        vLLMRolloutAgent(str(other), config, tiny_processor.tokenizer, tiny_processor,
                         inference_engine=object(), retriever=object())
    message = str(caught.value)
    assert "'llava'" in message and all(name in message for name in FAMILY_NAMES)


def test_a_processor_of_another_family_is_refused(family_models, tiny_model_dir, tiny_processor):
    qwen3 = family_models("qwen3-vl")
    with pytest.raises(UnsupportedModelError, match="Qwen2VLProcessor"):
        detect_family(qwen3.model_dir, tiny_processor)
    with pytest.raises(UnsupportedModelError, match="load the model's own processor"):
        vLLMRolloutAgent(str(tiny_model_dir), AgentRolloutConfig(prompt_length=64, response_length=64),
                         qwen3.processor.tokenizer, qwen3.processor, inference_engine=object(), retriever=object())
    with pytest.raises(UnsupportedModelError, match="unknown model family 'qwen9-vl'"):
        family_by_name("qwen9-vl")


def test_family_is_read_from_the_processor_without_a_local_config(family_model):
    assert detect_family("Org/remote-checkpoint", family_model.processor).name == family_model.family


class _FreeLastTurnDriver(EpisodeDriver):
    """The demo grammar drives the tool calls; the last turn samples freely, so its logprobs are
    those of the model itself and comparable with a forward pass (a grammar changes them)."""

    free_from: dict  # output row -> first response position of its free turn

    def request(self, episode, turn):
        prompt, params = super().request(episode, turn)
        if turn == self.max_turns - 1:
            params.structured_outputs = None
            self.free_from[episode.index] = len(episode.response_ids)
        return prompt, params


class _FreeLastTurn(vLLMRolloutAgent):
    driver_class = _FreeLastTurnDriver


# The tokens the rollout bans with a -100 logit bias, named independently of the code under test.
BANNED = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
          "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>")
TEMPERATURE = 0.7  # not 1: the logprobs must be those of the temperature-scaled distribution


def test_rollout_logprobs_equal_a_transformers_forward_pass(family_model):
    """The distribution actually sampled from: the model's logits, the ban on vision tokens and on
    the padded embedding rows past the tokenizer, the temperature, computed by transformers from
    the finished batch and compared token by token."""
    fm = family_model
    retriever = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
    base = make_agent(fm.model_dir, fm.processor, fm.llm, retriever, n=2, max_turns=3, calculate_log_probs=True,
                      temperature=TEMPERATURE)
    agent = _FreeLastTurn(str(fm.model_dir), base.config, fm.processor.tokenizer, fm.processor,
                          inference_engine=fm.llm, retriever=retriever)
    agent.driver.free_from = {}
    prompts = prompt_batch(fm.processor, sample_prompts(4), agent)
    output = agent.generate_sequences(prompts)
    assert output.meta_info["action_grammar"] is True and output.meta_info["model_family"] == fm.family
    assert output.meta_info["rollout_log_probs_mode"] == "processed_logprobs"
    model = AutoModelForImageTextToText.from_pretrained(fm.model_dir, dtype=torch.float32).eval()
    bias = torch.zeros(model.config.text_config.vocab_size)  # the logits' width, past the tokenizer
    bias[[fm.processor.tokenizer.convert_tokens_to_ids(token) for token in BANNED]] = -100.0
    bias[len(fm.processor.tokenizer):] = -100.0
    image_pad = fm.processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    width = prompts.batch["input_ids"].shape[1]
    compared, after_pages = 0, 0
    gaps = []
    for row, start in agent.driver.free_from.items():
        valid = output.batch["attention_mask"][row].bool()
        ids = output.batch["input_ids"][row][valid]
        images = sample_images(output, row)
        inputs = {"input_ids": ids[None], "mm_token_type_ids": (ids == image_pad).int()[None]}
        if images:
            inputs.update(fm.processor.image_processor(images=images, return_tensors="pt"))
        with torch.no_grad():
            logprobs = torch.log_softmax((model(**inputs).logits[0].float() + bias) / TEMPERATURE, dim=-1)
        prompt_len = int(output.batch["attention_mask"][row][:width].sum())
        loss = output.batch["loss_mask"][row]
        for j in range(start, int(output.batch["response_mask"][row].sum())):
            if not loss[j]:
                continue
            position = prompt_len + j
            expected = logprobs[position - 1, ids[position]]
            gaps.append(abs(float(output.batch["rollout_log_probs"][row, j]) - float(expected)))
            compared += 1
        after_pages += int((output.batch["responses"][row][:start] == image_pad).any())
    assert compared > 20 and after_pages > 0, (compared, after_pages)  # free turns that follow retrieved pages
    assert max(gaps) < 1e-3, f"max gap {max(gaps):.2e} over {compared} tokens"


class _EngineStub:
    """Only what the rollout reads of an engine at construction."""

    def __init__(self, max_model_len, logprobs_mode):
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_model_len,
                                                                       logprobs_mode=logprobs_mode))


def test_engine_limits_are_checked_at_construction(tiny_model_dir, tiny_processor):
    def build(engine, **overrides):
        config = AgentRolloutConfig(**{"prompt_length": 384, "response_length": 768, **overrides})
        return vLLMRolloutAgent(str(tiny_model_dir), config, tiny_processor.tokenizer, tiny_processor,
                                inference_engine=engine, retriever=object())

    with pytest.raises(ValueError, match="max_model_len 1000 < prompt_length \\+ response_length = 1152"):
        build(_EngineStub(1000, "processed_logprobs"))
    with pytest.raises(ValueError, match="max_model_len 1000 < prompt_length"):
        AgentRolloutConfig(prompt_length=384, response_length=768, max_model_len=1000)
    with pytest.raises(ValueError, match="logprobs_mode='processed_logprobs'"):
        build(_EngineStub(2048, "raw_logprobs"), calculate_log_probs=True, temperature=0.7)
    assert build(_EngineStub(2048, "raw_logprobs"), calculate_log_probs=True, temperature=1.0).logprobs_mode == "raw_logprobs"
    assert build(_EngineStub(1152, "processed_logprobs"), calculate_log_probs=True, temperature=0.7)
