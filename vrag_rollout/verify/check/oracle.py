"""The oracle: the model's own code in `model_dir`, never the rollout's.

Contract: `load_oracle(model_dir)` (cached) gives a `ModelOracle` with the model's config,
processor and tokenizer, its vision token ids and EOS ids, and three answers computed by the
model's own code: `expand_images` (the processor's pad run length and `image_grid_thw` per
image), `rope_index` (the family's transformers `get_rope_index` for one full row, on a
meta-device model: no weights) and `language_model` (the fp32 causal LM, loaded on first use).
A directory that is not a model of a family in `FAMILIES` raises `CheckInputError`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from PIL import Image

from .report import CheckInputError

# model_type -> (module, rope/base model class, causal LM class) in transformers 5.x.
FAMILIES = {
    "qwen2_vl": ("transformers.models.qwen2_vl.modeling_qwen2_vl", "Qwen2VLModel", "Qwen2VLForConditionalGeneration"),
    "qwen2_5_vl": (
        "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "Qwen2_5_VLModel", "Qwen2_5_VLForConditionalGeneration"
    ),
    "qwen3_vl": ("transformers.models.qwen3_vl.modeling_qwen3_vl", "Qwen3VLModel", "Qwen3VLForConditionalGeneration"),
}
_OTHER_VISION_NAMES = ("<|vision_pad|>",)


class ModelOracle:
    """The model's own config, processor, rope index and (lazily) weights."""

    def __init__(self, model_dir: str | Path):
        from transformers import AutoConfig, AutoProcessor

        self.model_dir = str(model_dir)
        try:
            self.config = AutoConfig.from_pretrained(self.model_dir)
        except Exception as e:  # OSError, ValueError, ... from a directory that is not a model
            raise CheckInputError(f"--model {self.model_dir}: cannot read a model config ({e})") from e
        self.family = self.config.model_type
        if self.family not in FAMILIES:
            raise CheckInputError(
                f"--model {self.model_dir} is a {self.family!r} model; check knows {sorted(FAMILIES)}"
            )
        try:
            self.processor = AutoProcessor.from_pretrained(self.model_dir)
        except Exception as e:
            raise CheckInputError(f"--model {self.model_dir}: cannot load its processor ({e})") from e
        self.tokenizer = self.processor.tokenizer
        c = self.config
        text = getattr(c, "text_config", None) or c
        self.logits_width = int(getattr(text, "vocab_size", None) or len(self.tokenizer))
        self.image_pad = int(c.image_token_id)
        self.video_pad = int(c.video_token_id)
        self.vision_start = int(c.vision_start_token_id)
        self.vision_end = int(c.vision_end_token_id)
        vocab = self.tokenizer.get_vocab()
        self.vision_ids = {self.image_pad, self.video_pad, self.vision_start, self.vision_end}
        self.vision_ids |= {vocab[name] for name in _OTHER_VISION_NAMES if name in vocab}
        self.eos_ids = self._eos_ids()
        self._rope_model = None
        self._lm = None

    def generation_header(self) -> str:
        """What the model's chat template writes to open an assistant turn (e.g.
        "<|im_start|>assistant\\n"): a native tool turn must end with it."""
        user = [{"role": "user", "content": "x"}]
        with_header = self.tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
        without = self.tokenizer.apply_chat_template(user, add_generation_prompt=False, tokenize=False)
        return with_header[len(without):]

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        try:
            from transformers import GenerationConfig

            eos = GenerationConfig.from_pretrained(self.model_dir).eos_token_id
            ids |= set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        except Exception:  # no generation_config.json: the tokenizer's EOS only
            pass
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids

    def _class(self, index: int) -> Any:
        module_name, *names = FAMILIES[self.family]
        return getattr(importlib.import_module(module_name), names[index])

    def rope_index(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   grids: Optional[torch.Tensor]) -> torch.Tensor:
        """(3, L) positions from the family's own `get_rope_index` for one full row."""
        if self._rope_model is None:
            with torch.device("meta"):  # get_rope_index needs the config only: no weights
                self._rope_model = self._class(0)(self.config)
        types = torch.zeros_like(input_ids, dtype=torch.int32)
        types[input_ids == self.image_pad] = 1
        types[input_ids == self.video_pad] = 2
        positions, _ = self._rope_model.get_rope_index(
            input_ids=input_ids[None], image_grid_thw=grids, attention_mask=attention_mask[None],
            **token_types(self._rope_model.get_rope_index, types[None]),
        )
        return positions[:, 0]

    def expand_images(self, images: Sequence[Image.Image]) -> tuple[list[int], Optional[torch.Tensor], Any]:
        """(pad run length per image, image_grid_thw, processor outputs) from the processor itself."""
        if not images:
            return [], None, None
        convert = self.tokenizer.convert_ids_to_tokens
        block = convert(self.vision_start) + convert(self.image_pad) + convert(self.vision_end)
        out = self.processor(text=[block * len(images)], images=list(images), return_tensors="pt")
        lengths = [end - start for start, end in _runs(out["input_ids"][0].tolist(), self.image_pad)]
        if len(lengths) != len(images):
            raise CheckInputError(f"the processor expanded {len(images)} images into {len(lengths)} pad runs")
        return lengths, out["image_grid_thw"], out

    def language_model(self) -> Any:
        if self._lm is None:
            self._lm = self._class(1).from_pretrained(self.model_dir, dtype=torch.float32).eval()
        return self._lm


@functools.lru_cache(maxsize=4)
def token_types(function: Any, types: torch.Tensor) -> dict:
    """`{"mm_token_type_ids": types}` for transformers' functions that take it (5.x), else {}
    (4.x's find images by their tokens)."""
    return {"mm_token_type_ids": types} if "mm_token_type_ids" in inspect.signature(function).parameters else {}


def load_oracle(model_dir: str) -> ModelOracle:
    return ModelOracle(model_dir)


def _runs(values: Sequence[int], target: int) -> list[tuple[int, int]]:
    """[(start, end)) of every maximal run of `target`."""
    out, start = [], None
    for i, value in enumerate(values):
        if value == target and start is None:
            start = i
        elif value != target and start is not None:
            out.append((start, i))
            start = None
    if start is not None:
        out.append((start, len(values)))
    return out
