"""Every family's tiny model has the structural traits of the released checkpoint it copies
(`tiny_families.ReleasedShape`; the ids and sizes below are read from the released config and
tokenizer files, restated here as the independent record the builder is checked against)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig, AutoProcessor, GenerationConfig

from vrag_rollout.devkit.tiny_model import build_tiny_model, default_model_dir
from vrag_rollout.families import FAMILY_NAMES, logits_width, padded_token_ids

# Qwen2-VL / Qwen2.5-VL / Qwen3-VL share these ids (tokenizer_config.json's added_tokens_decoder).
RELEASED_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|vision_start|>": 151652,
                "<|vision_end|>": 151653, "<|vision_pad|>": 151654, "<|image_pad|>": 151655, "<|video_pad|>": 151656}
LATER_IDS = {"qwen2-vl": {}, "qwen2.5-vl": {"<tool_call>": 151657, "</tool_call>": 151658, "<|file_sep|>": 151664},
             "qwen3-vl": {"<tool_call>": 151657, "</tool_call>": 151658, "<tool_response>": 151665,
                          "</tool_response>": 151666, "<think>": 151667, "</think>": 151668}}
# (len(tokenizer), vocab_size, tied) of Qwen2-VL-2B, Qwen2.5-VL-7B and Qwen3-VL-4B
SIZES = {"qwen2-vl": (151657, 151936, True), "qwen2.5-vl": (151665, 152064, False), "qwen3-vl": (151669, 151936, True)}
# generation_config.json's sampling fields of the three checkpoints
SAMPLING = {"qwen2-vl": dict(temperature=0.01, top_p=0.001, top_k=1, repetition_penalty=1.05),
            "qwen2.5-vl": dict(temperature=0.1, top_p=0.001, top_k=1, repetition_penalty=1.05),
            "qwen3-vl": dict(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.0)}
# added tokens that are not special (tokenizer_config.json's "special": false)
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"}
PIXELS = {"qwen2-vl": (3136, 12845056), "qwen2.5-vl": (3136, 12845056), "qwen3-vl": (65536, 16777216)}


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def built(request):
    model_dir = build_tiny_model(default_model_dir(request.param), request.param)
    return request.param, model_dir, AutoProcessor.from_pretrained(model_dir), AutoConfig.from_pretrained(model_dir)


def test_special_tokens_sit_at_their_released_ids(built):
    family, _, processor, config = built
    tok = processor.tokenizer
    for token, id_ in {**RELEASED_IDS, **LATER_IDS[family]}.items():
        assert tok.convert_tokens_to_ids(token) == id_, token
        assert tok.encode(token, add_special_tokens=False) == [id_]
    special = {added.content for added in tok.added_tokens_decoder.values() if added.special}
    assert set(RELEASED_IDS) <= special and not special & NOT_SPECIAL
    assert config.image_token_id == RELEASED_IDS["<|image_pad|>"]
    assert config.vision_start_token_id == RELEASED_IDS["<|vision_start|>"]


def test_vocabulary_is_padded_and_embeddings_tied_as_released(built):
    family, model_dir, processor, config = built
    length, vocab_size, tied = SIZES[family]
    assert len(processor.tokenizer) == length
    assert config.text_config.vocab_size == vocab_size > length
    assert bool(config.tie_word_embeddings) is tied
    weights = json.loads((model_dir / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
        (model_dir / "model.safetensors").read_bytes()[:8], "little")])
    assert ("lm_head.weight" in weights) is (not tied)


def test_generation_config_and_pixel_limits_are_the_released_ones(built):
    family, model_dir, processor, _ = built
    generation = GenerationConfig.from_pretrained(model_dir)
    assert sorted(generation.eos_token_id) == [151643, 151645] and generation.pad_token_id == 151643
    expected = SAMPLING[family]
    assert {key: getattr(generation, key) for key in expected} == expected
    size = processor.image_processor.size
    assert (size["shortest_edge"], size["longest_edge"]) == PIXELS[family]


def test_ordinary_text_never_encodes_to_a_filler(built):
    _, _, processor, _ = built
    tok = processor.tokenizer
    text = "<think>page 12 of the annual report</think><search>revenue 2023 fill42</search>"
    ids = tok.encode(text, add_special_tokens=False)
    assert max(i for i in ids if i < 151643) < 2048  # learned BPE only, never the filler range
    assert tok.decode(ids) == text


def test_the_padded_rows_are_the_ids_past_the_tokenizer(built):
    family, model_dir, processor, _ = built
    length, vocab_size, _ = SIZES[family]
    assert logits_width(model_dir) == vocab_size
    assert padded_token_ids(logits_width(model_dir), len(processor.tokenizer)) == tuple(range(length, vocab_size))
    assert padded_token_ids(None, length) == ()  # no readable config: nothing assumed


def test_the_rollout_bans_every_padded_row(tiny_model_dir, tiny_processor, tiny_llm):
    """The engine samples from every row of the LM head; the padded ones decode to nothing (a
    trained policy sampled id 151922 in `learn`'s evaluation before they were banned)."""
    from tests.rollout.agent_helpers import make_agent
    from vrag_rollout.retrieval.client import RetrieverClient

    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, RetrieverClient("http://127.0.0.1:9"))
    padded = set(range(len(tiny_processor.tokenizer), logits_width(tiny_model_dir)))
    assert len(padded) == 151936 - 151657
    bias = agent.driver.sampling.params_kwargs(16, seed=0)["logit_bias"]
    assert padded <= set(bias) and all(bias[token] == -100.0 for token in padded)
