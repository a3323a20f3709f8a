"""Per-family parts of the tiny offline models: chat template, processor, model config, and the
released checkpoint's shape.

Each family is built from its own transformers classes (config, model, processor, image and
video processors) so that transformers and vLLM load it exactly as they load the released
checkpoints; only the layer sizes are tiny. The sizes respect what vLLM's CPU backend accepts: a
text head_dim of 32 (16 is refused) and an `mrope_section` summing to head_dim / 2.

`ReleasedShape` holds what is *not* tiny: the traits of one released checkpoint of the family that
code can depend on (padded vocabulary, tied or untied embeddings, added tokens after the vision
block, generation defaults, processor pixel limits), read from its published config files
(docs/tiny-models.md lists them and how to check a new family's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# Chat templates written for this project in the shape of each family's released one: images
# render as <|vision_start|><|image_pad|><|vision_end|>, one pad per image (the processor and
# vLLM expand it). Qwen2-VL and Qwen2.5-VL open with a default system turn; Qwen3-VL does not.
_CONTENT_PARTS = (
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "{%- set image_count.value = image_count.value + 1 -%}"
    "{%- if add_vision_id -%}{{- 'Picture ' + image_count.value|string + ': ' -}}{%- endif -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'video' or 'video' in part -%}"
    "{%- set video_count.value = video_count.value + 1 -%}"
    "{%- if add_vision_id -%}{{- 'Video ' + video_count.value|string + ': ' -}}{%- endif -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in part -%}"
    "{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
)


# With `tools`, the system turn lists their JSON schemas inside <tools></tools>; an assistant
# message's `tool_calls` render after its content as <tool_call>{"name", "arguments"}</tool_call>
# blocks; consecutive `tool` messages are grouped into one user turn, each inside
# <tool_response></tool_response> (images included). The tags and the grouping are the Qwen
# families' tool-call interface; the instruction wording is this project's. Without tools and
# tool messages a conversation renders exactly as before.
_TOOLS_SYSTEM = (
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0]['role'] == 'system' -%}{{- messages[0]['content'] + '\\n\\n' -}}"
    "{%- elif default_system -%}{{- 'You are a helpful assistant.\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nThese functions are available; their signatures are listed inside <tools></tools>:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nTo call one, write its name and arguments as a JSON object inside <tool_call></tool_call>:\\n'"
    " + '<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}"
)
_TOOL_CALLS = (
    "{%- for call in message['tool_calls'] or [] -%}"
    "{%- set call = call['function'] if call['function'] is defined else call -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' -}}"
    "{%- if call['arguments'] is string -%}{{- call['arguments'] -}}{%- else -%}{{- call['arguments'] | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
)
_TOOL_RESPONSE = (
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' -}}" + _CONTENT_PARTS + "{{- '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
)


def _chat_template(default_system: bool) -> str:
    system = (
        "{%- if loop.first and message['role'] != 'system' and not tools -%}"
        "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' -}}"
        "{%- endif -%}"
        if default_system
        else ""
    )
    return (
        "{%- set image_count = namespace(value=0) -%}"
        "{%- set video_count = namespace(value=0) -%}"
        + ("{%- set default_system = true -%}" if default_system else "{%- set default_system = false -%}")
        + "{%- if tools -%}" + _TOOLS_SYSTEM + "{%- endif -%}"
        "{%- for message in messages -%}"
        "{%- if tools and loop.first and message['role'] == 'system' -%}"
        "{%- elif message['role'] == 'tool' -%}" + _TOOL_RESPONSE
        + "{%- else -%}"
        + system
        + "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
        + _CONTENT_PARTS
        + "{%- if message['role'] == 'assistant' -%}" + _TOOL_CALLS + "{%- endif -%}"
        + "{{- '<|im_end|>\\n' -}}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )


QWEN2_CHAT_TEMPLATE = _chat_template(default_system=True)
QWEN3_CHAT_TEMPLATE = _chat_template(default_system=False)

# Text sizes shared by every family: head_dim 32 with mrope sections (t, h, w) summing to 16.
_TEXT = dict(
    intermediate_size=256,
    num_hidden_layers=2,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
)
_MROPE = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]}


@dataclass(frozen=True)
class ReleasedShape:
    """The traits of one released checkpoint that a tiny model copies (`checkpoint` names it)."""

    checkpoint: str
    vocab_size: int  # rows of the embedding and the LM head: padded past the tokenizer
    tie_word_embeddings: bool  # the small sizes tie the LM head to the embedding, the large do not
    # tokens the released tokenizer adds after <|video_pad|> (151656), in id order: (token, special)
    added_tokens: tuple[tuple[str, bool], ...]
    sampling_defaults: dict  # generation_config.json's sampling fields
    min_pixels: int  # preprocessor_config.json's pixel limits
    max_pixels: int


_FIM_TOKENS = tuple((token, False) for token in ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                                                "<|repo_name|>", "<|file_sep|>"))
_TOOL_CALL_TOKENS = (("<tool_call>", False), ("</tool_call>", False))
# Qwen2-VL and Qwen2.5-VL Instruct: near-greedy defaults with a repetition penalty.
_QWEN2_PIXELS = dict(min_pixels=56 * 56, max_pixels=28 * 28 * 16384)

QWEN2_VL_SHAPE = ReleasedShape("Qwen/Qwen2-VL-2B-Instruct", 151936, True, (),
                               dict(temperature=0.01, top_p=0.001, top_k=1, repetition_penalty=1.05), **_QWEN2_PIXELS)
QWEN2_5_VL_SHAPE = ReleasedShape("Qwen/Qwen2.5-VL-7B-Instruct", 152064, False, _TOOL_CALL_TOKENS + _FIM_TOKENS,
                                 dict(temperature=0.1, top_p=0.001, top_k=1, repetition_penalty=1.05), **_QWEN2_PIXELS)
QWEN3_VL_SHAPE = ReleasedShape(
    "Qwen/Qwen3-VL-4B-Instruct", 151936, True,
    _TOOL_CALL_TOKENS + _FIM_TOKENS + (("<tool_response>", False), ("</tool_response>", False),
                                       ("<think>", False), ("</think>", False)),
    dict(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.0), min_pixels=65536, max_pixels=16777216)


@dataclass(frozen=True)
class TinyFamily:
    name: str  # the ModelFamily name
    patch_size: int  # vision patch in pixels; one merged token covers (patch * merge)^2
    chat_template: str
    shape: ReleasedShape
    build_processor: Callable[[Any, "TinyFamily", dict], Any]
    build_config: Callable[[dict, int, bool], Any]
    model_class: str  # transformers class name of the generation model

    @property
    def factor(self) -> int:
        return self.patch_size * 2

    def pixel_band(self) -> dict:
        """The released processor's pixel limits."""
        return {"shortest_edge": self.shape.min_pixels, "longest_edge": self.shape.max_pixels}


def _qwen2_processor(tok: Any, family: TinyFamily, size: dict) -> Any:
    import transformers
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    geometry = dict(patch_size=family.patch_size, temporal_patch_size=2, merge_size=2)
    processor_cls = getattr(transformers, "Qwen2_5_VLProcessor" if family.name == "qwen2.5-vl" else "Qwen2VLProcessor")
    return processor_cls(
        image_processor=Qwen2VLImageProcessor(size=size, **geometry),
        tokenizer=tok,
        video_processor=Qwen2VLVideoProcessor(size=size, **geometry),
        chat_template=family.chat_template,
    )


def _qwen3_processor(tok: Any, family: TinyFamily, size: dict) -> Any:
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    geometry = dict(patch_size=family.patch_size, temporal_patch_size=2, merge_size=2)
    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=size, **geometry),
        tokenizer=tok,
        video_processor=Qwen3VLVideoProcessor(size=size, **geometry),
        chat_template=family.chat_template,
    )


def _token_ids(ids: dict) -> dict:
    return dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )


def _text_ids(ids: dict) -> dict:
    return dict(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])


def _rope(**extra: Any) -> dict:
    """The text config's RoPE settings: transformers 5 reads `rope_parameters`; 4.x reads
    `rope_theta` and `rope_scaling` (where M-RoPE's sections live) and ignores `rope_parameters`."""
    import transformers

    params = dict(_MROPE, **extra)
    if int(transformers.__version__.split(".")[0]) >= 5:
        return {"rope_parameters": params}
    return {"rope_theta": params.pop("rope_theta"), "rope_scaling": params}


def _qwen2_vl_config(ids: dict, vocab_size: int, tied: bool) -> Any:
    from transformers import Qwen2VLConfig

    text = dict(_TEXT, vocab_size=vocab_size, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                **_rope(), **_text_ids(ids))
    vision = dict(depth=1, embed_dim=64, hidden_size=128, num_heads=4, mlp_ratio=2, in_channels=3,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    return Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tied, **_token_ids(ids))


def _qwen2_5_vl_config(ids: dict, vocab_size: int, tied: bool) -> Any:
    from transformers import Qwen2_5_VLConfig

    text = dict(_TEXT, vocab_size=vocab_size, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                **_rope(), **_text_ids(ids))
    # Two blocks: one with window attention and one with full attention, as the released model mixes them.
    vision = dict(depth=2, fullatt_block_indexes=[1], window_size=112, hidden_size=64, intermediate_size=128,
                  num_heads=4, out_hidden_size=128, in_channels=3, patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2, hidden_act="silu")
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tied, **_token_ids(ids))


def _qwen3_vl_config(ids: dict, vocab_size: int, tied: bool) -> Any:
    from transformers import Qwen3VLConfig

    text = dict(_TEXT, vocab_size=vocab_size, hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
                head_dim=32, **_rope(mrope_interleaved=True), **_text_ids(ids))
    # deepstack_visual_indexes: the first vision block also feeds the text layers, as in the release.
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                  num_position_embeddings=256, deepstack_visual_indexes=[0], in_channels=3, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2)
    return Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tied, **_token_ids(ids))


TINY_FAMILIES: dict[str, TinyFamily] = {
    family.name: family
    for family in (
        TinyFamily("qwen2-vl", 14, QWEN2_CHAT_TEMPLATE, QWEN2_VL_SHAPE, _qwen2_processor, _qwen2_vl_config,
                   "Qwen2VLForConditionalGeneration"),
        TinyFamily("qwen2.5-vl", 14, QWEN2_CHAT_TEMPLATE, QWEN2_5_VL_SHAPE, _qwen2_processor,
                   _qwen2_5_vl_config, "Qwen2_5_VLForConditionalGeneration"),
        TinyFamily("qwen3-vl", 16, QWEN3_CHAT_TEMPLATE, QWEN3_VL_SHAPE, _qwen3_processor, _qwen3_vl_config,
                   "Qwen3VLForConditionalGeneration"),
    )
}
