"""Every family's tiny model has the structural traits of the released checkpoint it copies
(`tiny_families.ReleasedShape`; the ids and sizes below are read from the released config and
tokenizer files, restated here as the independent record the builder is checked against).

The `released` shape has the released ids and widths; the `compact` shape (every other test's)
keeps every trait but those two: its special tokens sit at small ids that are none of the released
ones, and its vocabulary is padded past its tokenizer by as many rows as the release pads."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig, AutoProcessor, GenerationConfig

from vrag_rollout.devkit.tiny_model import COMPACT, RELEASED, build_tiny_model, default_model_dir
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


def _built(family: str, shape: str):
    model_dir = build_tiny_model(default_model_dir(family, shape), family, shape=shape)
    return family, model_dir, AutoProcessor.from_pretrained(model_dir), AutoConfig.from_pretrained(model_dir)


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def built(request):
    return _built(request.param, RELEASED)


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def compact(request):
    return _built(request.param, COMPACT)


def _has_lm_head(model_dir) -> bool:
    file = (model_dir / "model.safetensors").read_bytes()
    return "lm_head.weight" in json.loads(file[8:8 + int.from_bytes(file[:8], "little")])


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
    assert _has_lm_head(model_dir) is (not tied)


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


def test_compact_ids_are_none_of_the_released_ones(compact):
    """Code that hard-codes a released id fails on the compact model: its specials and added
    tokens sit below every released id, and its vocabulary is a thousand-odd rows."""
    family, _, processor, config = compact
    tok = processor.tokenizer
    ids = {token: tok.convert_tokens_to_ids(token) for token in {**RELEASED_IDS, **LATER_IDS[family]}}
    assert len(set(ids.values())) == len(ids) and max(ids.values()) < 4096, ids
    assert not set(ids.values()) & (set(RELEASED_IDS.values()) | set(LATER_IDS[family].values()))
    assert config.image_token_id == ids["<|image_pad|>"] != RELEASED_IDS["<|image_pad|>"]
    special = {added.content for added in tok.added_tokens_decoder.values() if added.special}
    assert set(RELEASED_IDS) <= special and not special & NOT_SPECIAL
    generation = GenerationConfig.from_pretrained(compact[1])
    assert sorted(generation.eos_token_id) == sorted([ids["<|im_end|>"], ids["<|endoftext|>"]])


def test_compact_keeps_the_released_padding_tying_sampling_and_pixels(compact):
    family, model_dir, processor, config = compact
    length, vocab_size, tied = SIZES[family]
    assert config.text_config.vocab_size - len(processor.tokenizer) == vocab_size - length  # 279, 399, 267 rows
    assert logits_width(model_dir) == config.text_config.vocab_size < 4096
    assert bool(config.tie_word_embeddings) is tied and _has_lm_head(model_dir) is (not tied)
    generation = GenerationConfig.from_pretrained(model_dir)
    assert {key: getattr(generation, key) for key in SAMPLING[family]} == SAMPLING[family]
    size = processor.image_processor.size
    assert (size["shortest_edge"], size["longest_edge"]) == PIXELS[family]


def test_the_rollout_bans_every_padded_row(released_model):
    """The engine samples from every row of the LM head; the padded ones decode to nothing (a
    trained policy sampled id 151922 in `learn`'s evaluation before they were banned)."""
    from tests.rollout.agent_helpers import make_agent
    from vrag_rollout.retrieval.client import RetrieverClient

    model = released_model
    agent = make_agent(model.model_dir, model.processor, model.llm, RetrieverClient("http://127.0.0.1:9"))
    length, vocab_size, _ = SIZES[model.family]
    padded = set(range(len(model.processor.tokenizer), logits_width(model.model_dir)))
    assert padded == set(range(length, vocab_size))
    bias = agent.driver.sampling.params_kwargs(16, seed=0)["logit_bias"]
    assert padded <= set(bias) and all(bias[token] == -100.0 for token in padded)
