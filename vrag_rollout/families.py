"""The model families the rollout serves, and how a model is recognised as one of them.

Contract: a model is served only if its config's `model_type` belongs to a family listed here;
anything else fails at construction with a message naming the supported families. A family
states only what its config and processor do not: its name, its processor class (EasyR1 picks
its position function by that name) and which transformers model class owns its
`get_rope_index`. The position-id layout is the one EasyR1's dataset builds for every family
(text row + 3 mrope rows); the rollout follows the layout of the prompts it is given.
Everything numeric (patch size, merge size, pixel band, token ids) is read from the model's own
processor and tokenizer at run time, never from this table.

Checkpoints are read as transformers finds them (`model_config`): a local directory, or a hub id
(`Qwen/Qwen2.5-VL-7B-Instruct`, as verl configs name models) through the hub cache
(HF_HOME / HF_HUB_CACHE, honouring HF_HUB_OFFLINE).

Position rule: for still images the three Qwen VL families share one mrope rule (an image's
merged patches at (t, h, w) offsets from the next text position; text resumes one past their
maximum), so `positions.rope_positions` serves all of them; videos, where they differ (Qwen3-VL
uses per-frame timestamps), are not part of an agent episode (the engine admits 0 videos).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


# The Qwen VL special tokens of images, videos and grounding that a policy must never sample (the
# rollout bans them; the weight-sync check bans the same ones). The same in all three families.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
GROUNDING_TOKENS = ("<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
                    "<|quad_start|>", "<|quad_end|>")
BANNED_SPECIAL_TOKENS = VISION_TOKENS + GROUNDING_TOKENS


class UnsupportedModelError(ValueError):
    """The model is not of a family this rollout serves (the message lists the supported ones)."""


class UnreadableModelError(ValueError):
    """The model's config cannot be read where the caller needs it (the message says where it
    looked and what to set)."""


@dataclass(frozen=True)
class ModelFamily:
    name: str  # what users type: --family qwen2.5-vl
    model_types: tuple[str, ...]  # config.json `model_type` values of this family
    processor_class: str  # the family's processor class in transformers
    # "module:Class" whose get_rope_index is this family's own: the positions must equal it.
    rope_model_class: str
    # How the family writes a box (core/regions.py): 0..1000 of the image, or pixels as shown.
    grounding_frame: str = "relative-1000"


QWEN2_VL = ModelFamily(
    name="qwen2-vl",
    model_types=("qwen2_vl",),
    processor_class="Qwen2VLProcessor",
    rope_model_class="transformers.models.qwen2_vl.modeling_qwen2_vl:Qwen2VLModel",
)
QWEN2_5_VL = ModelFamily(
    name="qwen2.5-vl",
    model_types=("qwen2_5_vl",),
    processor_class="Qwen2_5_VLProcessor",
    rope_model_class="transformers.models.qwen2_5_vl.modeling_qwen2_5_vl:Qwen2_5_VLModel",
    grounding_frame="absolute",  # pixels of the resized image the model saw
)
QWEN3_VL = ModelFamily(
    name="qwen3-vl",
    model_types=("qwen3_vl", "qwen3_vl_moe"),
    processor_class="Qwen3VLProcessor",
    rope_model_class="transformers.models.qwen3_vl.modeling_qwen3_vl:Qwen3VLModel",
)
FAMILIES: tuple[ModelFamily, ...] = (QWEN2_VL, QWEN2_5_VL, QWEN3_VL)
FAMILY_NAMES: tuple[str, ...] = tuple(family.name for family in FAMILIES)


def _supported() -> str:
    return ", ".join(f"{f.name} (model_type {' / '.join(f.model_types)})" for f in FAMILIES)


def family_by_name(name: str) -> ModelFamily:
    for family in FAMILIES:
        if family.name == name:
            return family
    raise UnsupportedModelError(f"unknown model family {name!r}; supported: {', '.join(FAMILY_NAMES)}")


def family_of_model_type(model_type: Optional[str]) -> ModelFamily:
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    raise UnsupportedModelError(
        f"model_type {model_type!r} is not supported by vrag-rollout; supported families: {_supported()}. "
        "(Qwen3.5 and other natively multimodal models are not supported yet; see README, 'Model families'.)"
    )


def model_config(model_path: Any, *, download: bool = False) -> Optional[dict]:
    """The checkpoint's config.json as transformers finds it: a local directory's, else a hub
    id's from the hub cache (HF_HOME / HF_HUB_CACHE); with `download`, from the hub when the cache
    lacks it, unless HF_HUB_OFFLINE. None when there is none to read."""
    from transformers.utils import cached_file

    try:
        path = cached_file(str(model_path), "config.json", local_files_only=not download)
        return json.loads(Path(path).read_text(encoding="utf-8")) if path else None
    except (OSError, ValueError, TypeError):  # no such directory, nor cached repo; an id the hub refuses
        return None


def _model_type(model_path: Any) -> Optional[str]:
    """`model_type` from the checkpoint's config (local or cached), or None when there is none to read."""
    config = model_config(model_path)
    return config.get("model_type") if isinstance(config, dict) else None


def logits_width(model_path: Any, *, required: bool = False) -> Optional[int]:
    """Rows of the model's embedding and LM head (its logits' width): the checkpoint's
    `text_config.vocab_size` (or top-level `vocab_size`), read as `model_config` finds it (a
    hub id may be fetched). None when there is none to read; with `required`, an
    `UnreadableModelError` instead, naming the path (the caller cannot ban the padded rows)."""
    config = model_config(model_path, download=True)
    try:
        width = (config.get("text_config") or {}).get("vocab_size") or config["vocab_size"]
        return int(width)
    except (AttributeError, KeyError, TypeError, ValueError):
        if not required:
            return None
    from huggingface_hub import constants

    fetched = ("HF_HUB_OFFLINE is set, so it was not fetched" if constants.HF_HUB_OFFLINE
               else "nor could it be fetched from the hub")
    raise UnreadableModelError(
        f"cannot read the vocabulary size of {model_path!r}: no config.json with vocab_size in that directory, "
        f"nor in the Hugging Face cache ({constants.HF_HUB_CACHE}) for that hub id; {fetched}")


def padded_token_ids(width: Optional[int], tokenizer_size: int) -> tuple[int, ...]:
    """The ids of embedding rows past the tokenizer: released checkpoints pad the vocabulary
    (151936 rows for 151665 tokens), no text decodes to these ids, and the engine samples from
    every row, so the rollout bans them with the vision tokens. Empty when `width` is unknown."""
    return tuple(range(int(tokenizer_size), int(width))) if width else ()


def _family_of_processor(processor: Any) -> Optional[ModelFamily]:
    name = type(processor).__name__
    for family in FAMILIES:
        if name in (family.processor_class, family.processor_class + "Fast"):
            return family
    return None


def detect_family(model_path: Any = None, processor: Any = None, model_type: Optional[str] = None) -> ModelFamily:
    """The family of a model, from its config's `model_type` (an explicit one, else the
    checkpoint's config.json: a local directory's or a hub id's cached one), else from the
    processor class; the two must agree when both are known, since a processor of another family
    computes other image grids than the engine."""
    model_type = model_type or (_model_type(model_path) if model_path is not None else None)
    from_processor = _family_of_processor(processor) if processor is not None else None
    if model_type is not None:
        family = family_of_model_type(model_type)
        if processor is not None and from_processor not in (None, family):
            raise UnsupportedModelError(
                f"the model is {family.name} (model_type {model_type!r}) but the processor is a "
                f"{type(processor).__name__} ({from_processor.name}): load the model's own processor"
            )
        return family
    if from_processor is not None:
        return from_processor
    raise UnsupportedModelError(
        f"cannot tell the model family of {model_path!r} (no readable config.json and processor "
        f"{type(processor).__name__}); supported families: {_supported()}"
    )
