"""Helpers for the check/view tests: real rollouts saved to disk, trainer-batch pickles, planted
defects, and failure assertions."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image, ImageDraw

from tests.conftest import SAMPLE_RETRIEVAL
from tests.rollout.agent_helpers import make_agent, prompt_batch
from vrag_rollout.core.tool_turns import tools_for
from vrag_rollout.devkit import planted_defects
from vrag_rollout.core.pages import pixels
from vrag_rollout.retrieval.fixtures import FixtureTransport
from vrag_rollout.retrieval.client import RetrieverClient
from vrag_rollout.verify.saved_batch import save_rollout


N = 2  # samples per prompt


@dataclass
class Rollout:
    output: Any  # the rollout's DataProto
    path: Path  # saved with save_rollout
    config: Any
    model_dir: Path


def roll(model_dir, processor, llm, samples, path: Path, **overrides) -> Rollout:
    retriever = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
    agent = make_agent(model_dir, processor, llm, retriever, n=N, **overrides)
    # the native tool-call format's prompts carry the tool schemas in their system turn
    tools = tools_for(agent.config) if agent.config.action_format == "tool_call" else None
    output = agent.generate_sequences(prompt_batch(processor, samples, agent, tools=tools))
    save_rollout(output, path, processor=processor, model_path=model_dir, config=agent.config)
    return Rollout(output, path, agent.config, model_dir)


def drawing(width: int, height: int, seed: int) -> Image.Image:
    """A small image whose content (not size) depends on the seed."""
    image = Image.new("RGB", (width, height), (255, 255, 250))
    draw = ImageDraw.Draw(image)
    for k in range(6):
        x, y = (37 * (seed + 1) * (k + 1)) % width, (53 * (seed + 2) * (k + 1)) % height
        draw.rectangle([x, y, min(width - 1, x + 30), min(height - 1, y + 20)], fill=(40 * k, 200 - 30 * seed, 90))
    return image


def pickled_trainer_batch(output: Any, path: Path) -> Path:
    """The rollout output as EasyR1's trainer holds it, pickled with the real verl DataProto:
    response_mask = the loss mask (as EasyR1's adapter hands it over), v0.3's "image" key, {"bytes": ...}
    entries, and no vrag-rollout metadata (no token texts, family, grammar flag or grammars)."""
    import verl.protocol as verl_protocol

    mm = []
    for item in output.non_tensor_batch["multi_modal_data"]:
        entries = []
        for image in item["images"]:
            buf = io.BytesIO()
            pixels(image).save(buf, format="PNG")
            entries.append({"bytes": buf.getvalue(), "path": None})
        mm.append({"image": entries})
    columns = {k: v for k, v in output.non_tensor_batch.items() if k != "multi_modal_data"}
    meta = {k: v for k, v in output.meta_info.items()
            if k not in ("model_family", "action_grammar", "action_regex", "first_turn_action_regex")}
    tensors = {key: value.clone() for key, value in output.batch.items()}
    tensors["response_mask"] = tensors["loss_mask"].clone()  # EasyR1 has one mask: the loss mask (docs/easyr1.md)
    proto = verl_protocol.DataProto.from_dict(
        tensors=tensors, non_tensors={**columns, "multi_modal_data": mm}, meta_info=meta
    )
    proto.save_to_disk(str(path))
    return path


def set_token(saved: Any, row: int, position: int, token: int) -> None:
    """Change one token of a saved batch's row (full prompt+response position), in every view."""
    t = saved.tensors
    P = t["prompts"].shape[1]
    t["input_ids"][row, position] = token
    if position < P:
        t["prompts"][row, position] = token
    else:
        t["responses"][row, position - P] = token


def caught(report, check: str, sample: int, position: int, fragment: str = ""):
    hits = [f for f in report.failures if f.check == check and f.sample == sample and f.position == position
            and fragment in f.message]
    assert hits, f"no {check} failure for sample {sample} position {position}:\n{report.human()}"
    assert not report.ok
    text = str(hits[0])
    assert f"sample {sample}" in text and f"position {position}" in text
    return hits[0]


runs = planted_defects.runs  # [start, end) of every run of a value in a list


def token_id(processor, name: str) -> int:
    return processor.tokenizer.convert_tokens_to_ids(name)


def response_image_runs(saved, row: int, image_pad: int) -> list[tuple[int, int]]:
    return runs(saved.tensors["responses"][row].tolist(), image_pad)


def rows_with_response_images(saved, image_pad: int) -> list[int]:
    return [row for row in range(len(saved)) if response_image_runs(saved, row, image_pad)]


def observation_blocks(saved, row: int) -> list[tuple[int, int]]:
    """Response [start, end) of every loss-masked-out block inside the real response."""
    P = saved.tensors["prompts"].shape[1]
    used = int(saved.tensors["attention_mask"][row, P:].sum())
    return runs(saved.tensors["loss_mask"][row, :used].tolist(), 0)


def delete_response_token(saved, row: int, position: int) -> None:
    """Remove response token `position` of a row, shifting the rest left (as a truncating bug would)."""
    t = saved.tensors
    P = t["prompts"].shape[1]
    for key, value in t.items():
        if value.shape[-1] == t["responses"].shape[1]:
            cut = position
        elif value.shape[-1] == t["input_ids"].shape[1]:
            cut = P + position
        else:
            continue
        rowv = value[row]
        fill = rowv[..., -1:].clone()
        if key in ("attention_mask", "response_mask", "loss_mask", "rollout_log_probs"):
            fill = torch.zeros_like(fill)
        value[row] = torch.cat([rowv[..., :cut], rowv[..., cut + 1:], fill], dim=-1)


def copy_sample(saved, source: int, target: int) -> None:
    """Make sample `target` a copy of sample `source` in every tensor, image list and column."""
    for value in saved.tensors.values():
        value[target] = value[source]
    saved.images[target] = list(saved.images[source])
    for column in saved.columns.values():
        column[target] = column[source]
