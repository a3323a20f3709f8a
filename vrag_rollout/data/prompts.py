"""Prompt batches as an EasyR1-style dataset builds them (for the demo, tests and standalone use).

`build_prompts(samples, tokenizer=, processor=, config=)` is the public entry: questions (with
optional prompt images) to the batch `vLLMRolloutAgent.generate_sequences` takes, for the
config's action format (the native format's prompts carry the tool schemas, rendered with
`config.chat_template` when set, and its instructions), `prompt_length`, `doc_id_key` and
position layout. `build_prompt_batch` is the lower-level builder under it.

Each prompt is rendered with the chat template, its images expanded to their processor grids in
`input_ids` (left-padded to `prompt_length`), with `raw_prompt_ids` holding one pad per image as
the engine wants, and mrope position ids in the (bs, 4, P) layout: the text row, then mrope.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ..formats import TagFormat, ToolCallFormat, format_named

# torch, numpy and the batch type load when a batch is built: the instructions and `PromptSample`
# stay cheap to import for the commands' checks before any model loads.

# The formats' default instructions (each format's module holds its own).
AGENT_INSTRUCTIONS = TagFormat.instructions
TOOL_CALL_INSTRUCTIONS = ToolCallFormat.instructions


@dataclass
class PromptSample:
    question: str
    doc_id: Optional[str] = None
    images: list = field(default_factory=list)  # PIL images shown with the question
    instructions: str = AGENT_INSTRUCTIONS


def instructions_for(action_format: str, region_action: bool = False, scope: str = "document") -> str:
    """The default instructions of an action format for a search `scope` ("document" or "corpus",
    `formats.base.SCOPES`), with the region action's when it is on."""
    return format_named(action_format).instructions_for(region_action, scope)


def render_prompt(tokenizer: Any, sample: PromptSample, tools: Optional[Sequence[dict]] = None,
                  chat_template: Optional[str] = None) -> str:
    """The chat template's prompt (the tokenizer's own, or `chat_template`); with `tools` (the
    native tool-call format) their schemas go into the system turn as the template writes them."""
    content = [{"type": "image"} for _ in sample.images]
    content.append({"type": "text", "text": f"{sample.instructions}\nQuestion: {sample.question}"})
    messages = [{"role": "user", "content": content}]
    extra = {"tools": list(tools)} if tools else {}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                         chat_template=chat_template, **extra)


def build_prompt_batch(
    tokenizer: Any,
    processor: Any,
    samples: Sequence[PromptSample],
    prompt_length: int,
    *,
    doc_id_key: str = "doc_id",
    position_rows: int = 4,
    proto_cls: Optional[type] = None,
    meta_info: Optional[dict] = None,
    tools: Optional[Sequence[dict]] = None,
    chat_template: Optional[str] = None,
) -> Any:
    """The prompt batch (module docstring) as `proto_cls` (default: the project's `DataProto`)."""
    import numpy as np
    import torch

    from ..core.positions import rope_positions
    from ..protocol import DataProto, object_array

    proto_cls = proto_cls or DataProto
    vocab = tokenizer.get_vocab()
    image_pad = vocab["<|image_pad|>"]
    image_processor = processor.image_processor
    merge = int(getattr(image_processor, "merge_size", 2))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    rows_ids, rows_mask, rows_pos, raw_ids, mm_data = [], [], [], [], []
    for sample in samples:
        raw = tokenizer.encode(render_prompt(tokenizer, sample, tools, chat_template), add_special_tokens=False)
        grids: list[tuple[int, int, int]] = []
        if sample.images:
            grid_tensor = image_processor(images=sample.images, return_tensors="pt")["image_grid_thw"]
            grids = [tuple(int(x) for x in grid) for grid in grid_tensor]
        expanded = expand_pads(raw, grids, image_pad, merge)
        if len(expanded) > prompt_length:
            raise ValueError(f"prompt of {len(expanded)} tokens exceeds prompt_length={prompt_length}")
        rope = rope_positions(expanded, grids, image_pad_id=image_pad, merge_size=merge)
        text = torch.arange(len(expanded)).unsqueeze(0)
        positions = torch.cat([text, rope]) if position_rows == 4 else rope
        left = prompt_length - len(expanded)
        rows_ids.append(torch.tensor([pad_id] * left + expanded))
        rows_mask.append(torch.tensor([0] * left + [1] * len(expanded)))
        rows_pos.append(torch.cat([torch.zeros((positions.size(0), left), dtype=torch.long), positions], dim=-1))
        raw_ids.append(raw)
        mm_data.append({"images": list(sample.images)})

    tensors = {
        "input_ids": torch.stack(rows_ids),
        "attention_mask": torch.stack(rows_mask),
        "position_ids": torch.stack(rows_pos),
    }
    non_tensors = {
        "raw_prompt_ids": object_array(raw_ids),
        doc_id_key: np.array([sample.doc_id for sample in samples], dtype=object),
    }
    if any(sample.images for sample in samples):
        non_tensors["multi_modal_data"] = object_array(mm_data)
    meta = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": pad_id, **(meta_info or {})}
    return proto_cls.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)


def build_prompts(samples: Sequence[PromptSample], *, tokenizer: Any, processor: Any, config: Any) -> Any:
    """The prompt batch of `samples` for `config` (an `AgentRolloutConfig`; see the module docstring).

    A sample that keeps the default instructions (`AGENT_INSTRUCTIONS`, the tags format's) is
    given its format's (`instructions_for`: `TOOL_CALL_INSTRUCTIONS` in the native format, and the
    region action's sentence with `region_action`); other instructions are used as they are."""
    from dataclasses import replace

    if not samples:
        raise ValueError("build_prompts: no samples")
    action_format = format_named(config.action_format)
    default = action_format.instructions_for(bool(getattr(config, "region_action", False)))
    samples = [replace(sample, instructions=default) if sample.instructions == AGENT_INSTRUCTIONS else sample
               for sample in samples]
    return build_prompt_batch(tokenizer, processor, samples, config.prompt_length, doc_id_key=config.doc_id_key,
                              position_rows=3 if config.position_ids_layout == "3" else 4,
                              tools=action_format.prompt_tools(config), chat_template=action_format.prompt_template(config))


def expand_pads(ids: Sequence[int], grids: Sequence[tuple[int, int, int]], image_pad: int, merge: int) -> list[int]:
    """`ids` with each image's one pad expanded to its t*h*w/merge² pads (the trainer's view)."""
    out: list[int] = []
    images = iter(grids)
    for token in ids:
        if token == image_pad:
            t, h, w = next(images)
            out.extend([image_pad] * (t * h * w // (merge * merge)))
        else:
            out.append(token)
    return out

