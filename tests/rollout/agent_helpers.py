"""Helpers shared by the end-to-end rollout tests: prompts, agents and the independent oracles."""

from __future__ import annotations

import random
import threading
import time

import importlib

import torch
from PIL import Image, ImageDraw

from vrag_rollout import vLLMRolloutAgent
from vrag_rollout.devkit.demo import demo_config, demo_page_band, demo_questions
from vrag_rollout.data.prompts import PromptSample, build_prompt_batch
from vrag_rollout.core.pages import pixels


def cover_image(seed: int) -> Image.Image:
    """A small deterministic 'document cover' shown with some questions."""
    image = Image.new("RGB", (140 + 28 * seed, 196), (250, 250, 245))
    draw = ImageDraw.Draw(image)
    draw.rectangle([10, 10, 120, 40 + 10 * seed], outline=(20, 20, 20), width=3)
    draw.text((14, 60), f"cover {seed}", fill=(0, 0, 0))
    return image


def sample_prompts(count: int, with_images: bool = True) -> list[PromptSample]:
    samples = demo_questions()[:count]
    if with_images:
        for i, sample in enumerate(samples):
            if i % 2 == 0:
                sample.images = [cover_image(i)]
    return samples


def make_agent(model_dir, processor, llm, retriever, **overrides) -> vLLMRolloutAgent:
    config = demo_config(**{**demo_page_band(processor), **overrides})
    return vLLMRolloutAgent(str(model_dir), config, processor.tokenizer, processor, inference_engine=llm, retriever=retriever)


def prompt_batch(processor, samples, agent, **kwargs):
    return build_prompt_batch(processor.tokenizer, processor, samples, agent.config.prompt_length, **kwargs)


def sample_images(output, row: int) -> list:
    """The sample's images as an image processor takes them (a page entry's decoded pixels)."""
    item = output.non_tensor_batch["multi_modal_data"][row]
    return [pixels(image) for image in next(iter(item.values()))]


def processor_grids(processor, images) -> torch.Tensor | None:
    if not images:
        return None
    return processor.image_processor(images=images, return_tensors="pt")["image_grid_thw"]


def hf_rope_index(processor, model_dir, input_ids, attention_mask, grids) -> torch.Tensor:
    """transformers' own get_rope_index of the model's family (Qwen2VLModel, Qwen2_5_VLModel,
    Qwen3VLModel, picked by the config's model_type) for one sample: (3, L)."""
    from transformers import AutoConfig

    key = str(model_dir)
    if key not in _MODELS:
        config = AutoConfig.from_pretrained(model_dir)
        module, name = ROPE_CLASSES[config.model_type]
        _MODELS[key] = getattr(importlib.import_module(module), name)(config).eval()
    model = _MODELS[key]
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    types = (input_ids == image_pad).int()
    positions, _ = model.get_rope_index(
        input_ids[None], types[None], image_grid_thw=grids, attention_mask=attention_mask[None]
    )
    return positions[:, 0]


_MODELS: dict = {}
# Written out here, not taken from vrag_rollout.families: the oracle must not come from the code under test.
# (module, class), imported on first use: the modeling modules take seconds to import.
ROPE_CLASSES = {
    "qwen2_vl": ("transformers.models.qwen2_vl.modeling_qwen2_vl", "Qwen2VLModel"),
    "qwen2_5_vl": ("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "Qwen2_5_VLModel"),
    "qwen3_vl": ("transformers.models.qwen3_vl.modeling_qwen3_vl", "Qwen3VLModel"),
}


class DelayedReplay:
    """The recorded retriever answering after a random delay of this process's own (so results
    come back at varying engine steps); counts the calls out at once, and can start raising an
    unexpected error after `fail_after` calls (a bug in the retriever path). With `text_suffix`,
    every text page it serves ends with that text (e.g. special-token strings a page may hold)."""

    def __init__(self, low_s: float = 0.0, high_s: float = 0.03, fail_after: int | None = None,
                 text_suffix: str = ""):
        from tests.conftest import SAMPLE_RETRIEVAL
        from vrag_rollout.retrieval.fixtures import FixtureTransport

        self.inner = FixtureTransport.load(SAMPLE_RETRIEVAL)
        self.low_s, self.high_s, self.fail_after = low_s, high_s, fail_after
        self.text_suffix = text_suffix
        self.rng = random.Random()
        self.lock = threading.Lock()
        self.out = self.most_out = self.calls = self.text_pages = 0

    def post(self, path, body, timeout):
        with self.lock:
            self.calls += 1
            if self.fail_after is not None and self.calls > self.fail_after:
                raise RuntimeError("a bug in the retriever path")
            self.out += 1
            self.most_out = max(self.most_out, self.out)
        try:
            time.sleep(self.rng.uniform(self.low_s, self.high_s))
            answer = self.inner.post(path, body, timeout)
            return self._with_suffix(answer, body) if self.text_suffix and path == "/batch_fetch" else answer
        finally:
            with self.lock:
                self.out -= 1

    def _with_suffix(self, answer, body):
        out = []
        for spec, item in zip(body["query"], answer):
            if spec.startswith("text") and isinstance(item.get("contents"), str) and item.get("id") == spec:
                item = dict(item, contents=item["contents"] + self.text_suffix)
                with self.lock:
                    self.text_pages += 1
            out.append(item)
        return out

    def get(self, path, timeout):
        return self.inner.get(path, timeout)

    def close(self):
        pass
