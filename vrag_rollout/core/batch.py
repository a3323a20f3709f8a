"""Episodes -> the EasyR1 rollout output batch (pure tensor work, no engine, no HTTP).

A batch row is one episode, or, under a context policy, one segment of it (`batch_rows`: an
episode's closed segments, then its current row, adjacent and in order). A segment row's
response part begins with its context (`context_length` tokens): out of `loss_mask` and of the
rollout log-probs, its sampled tokens marked in `sampled_mask`. Columns that only segmented
batches have (`sampled_mask`, `episode_id`, `segment_index`, `context_length`) appear only when
`BatchSpec.segmented`, so a batch without a context policy is what it always was.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from .episode import Episode
from .positions import rope_positions, text_positions
from ..protocol import object_array


@dataclass(frozen=True)
class BatchSpec:
    response_length: int
    pad_token_id: int
    image_pad_id: int
    merge_size: int
    position_layout: str = "auto"  # "auto" | "4" | "3"
    image_key: str = "images"
    with_logprobs: bool = False
    segmented: bool = False  # a context policy was on: add the segment columns


@dataclass(frozen=True)
class BatchRow:
    episode: Episode
    part: Any  # the episode itself (its current row) or a closed `context_edit.Segment`
    segment_index: int

    @property
    def final(self) -> bool:
        return self.part is self.episode


def batch_rows(episodes: Sequence[Episode]) -> list[BatchRow]:
    """Each episode's rows in order: its closed segments, then its current row."""
    return [BatchRow(ep, part, k) for ep in episodes for k, part in enumerate([*ep.segments, ep])]


def as_rows(samples: Sequence[BatchRow | Episode]) -> list[BatchRow]:
    """Rows as given, an episode taken as its one row."""
    return [s if isinstance(s, BatchRow) else BatchRow(s, s, 0) for s in samples]


def row_training_view(part: Any) -> tuple[list[int], list[float]]:
    """A row's own loss mask and rollout log-probs (lists over its response tokens): its context
    (`context_length` tokens, sampled under another context) out of the loss, log-prob 0 there."""
    context = int(getattr(part, "context_length", 0))
    loss, logprobs = list(part.loss_mask), [float(x) for x in part.logprobs]
    loss[:context] = [0] * min(context, len(loss))
    logprobs[:context] = [0.0] * min(context, len(logprobs))
    return loss, logprobs


def response_tensors(samples: Sequence[BatchRow | Episode], spec: BatchSpec) -> dict[str, torch.Tensor]:
    """responses, response_mask (real tokens, through the final EOS), loss_mask (sampled tokens
    after the row's context), turn_ids (each token's turn from 1, the observation answering a
    turn included; 0 at padding); segmented, `sampled_mask` (every sampled token, context too)."""
    rows = as_rows(samples)
    size, length = len(rows), spec.response_length
    responses = torch.full((size, length), spec.pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((size, length), dtype=torch.long)
    loss_mask = torch.zeros((size, length), dtype=torch.long)
    logprobs = torch.zeros((size, length), dtype=torch.float32)
    turn_ids = torch.zeros((size, length), dtype=torch.long)
    sampled_mask = torch.zeros((size, length), dtype=torch.long)
    for row, batch_row in enumerate(rows):
        part = batch_row.part
        used = len(part.response_ids)
        if used > length:
            raise AssertionError(f"episode {batch_row.episode.index} overran its budget: {used} > {length}")
        responses[row, :used] = torch.tensor(part.response_ids, dtype=torch.long)
        response_mask[row, :used] = 1
        sampled_mask[row, :used] = torch.tensor(part.loss_mask, dtype=torch.long)
        own_loss, own_logprobs = row_training_view(part)
        logprobs[row, :used] = torch.tensor(own_logprobs, dtype=torch.float32)
        turn_ids[row, :used] = torch.tensor(part.turn_ids, dtype=torch.long)
        loss_mask[row, :used] = torch.tensor(own_loss, dtype=torch.long)
    out = {"responses": responses, "response_mask": response_mask, "loss_mask": loss_mask, "turn_ids": turn_ids}
    if spec.segmented:
        out["sampled_mask"] = sampled_mask
    if spec.with_logprobs:
        out["rollout_log_probs"] = logprobs
    return out


def _continue_by_one(last: torch.Tensor, count: int) -> torch.Tensor:
    """(…,) last positions -> (…, count) positions last+1 … last+count."""
    return last.unsqueeze(-1) + torch.arange(1, count + 1, dtype=last.dtype)


def response_position_ids(
    prompt_positions: torch.Tensor,
    prompt_mask: torch.Tensor,
    samples: Sequence[BatchRow | Episode],
    spec: BatchSpec,
) -> torch.Tensor:
    """Position ids of prompt+response in the layout of `prompt_positions` (or the forced one).

    2-D prompts continue one per token. For the Qwen VL families (bs, 3|4, P): the text row continues the
    prompt's text row by one per token; the mrope rows of the response are computed over the
    response's tokens and images, starting one past the prompt's largest mrope position. Padding
    after a response continues by one per token, so the text row strictly increases in a sample.
    """
    length = spec.response_length
    if prompt_positions.dim() == 2:
        return torch.cat([prompt_positions, _continue_by_one(prompt_positions[:, -1], length)], dim=-1)
    rows = prompt_positions.size(1)
    if rows not in (3, 4):
        raise ValueError(f"position_ids must be (bs, P), (bs, 3, P) or (bs, 4, P); got {tuple(prompt_positions.shape)}")
    if rows == 4:
        text_row, rope = prompt_positions[:, 0], prompt_positions[:, 1:]
    else:
        rope = prompt_positions
        text_row = text_positions(prompt_mask)
    text_out = torch.cat([text_row, _continue_by_one(text_row[:, -1], length)], dim=-1)

    rope_out = torch.empty((rope.size(0), 3, rope.size(-1) + length), dtype=torch.long)
    rope_out[:, :, : rope.size(-1)] = rope
    for row, batch_row in enumerate(as_rows(samples)):
        part = batch_row.part
        valid = prompt_mask[row].bool()
        start = int(rope[row][:, valid].max()) + 1 if bool(valid.any()) else 0
        used = len(part.response_ids)
        grids = [page.grid_thw for page in part.images]
        response_rope = rope_positions(
            part.response_ids, grids, image_pad_id=spec.image_pad_id, merge_size=spec.merge_size, start=start
        )
        rope_out[row, :, rope.size(-1) : rope.size(-1) + used] = response_rope
        last = int(response_rope.max()) if used else start - 1
        rope_out[row, :, rope.size(-1) + used :] = _continue_by_one(torch.tensor(last), length - used)

    layout = spec.position_layout if spec.position_layout != "auto" else str(rows)
    if layout == "3":
        return rope_out
    return torch.cat([text_out.unsqueeze(1), rope_out], dim=1)


def collect_metrics(episodes: Sequence[Episode], client_stats: dict, elapsed: float) -> dict[str, float]:
    count = max(len(episodes), 1)
    reasons = Counter(ep.termination for ep in episodes)
    metrics = {
        "rollout/turns_mean": sum(ep.turns for ep in episodes) / count,
        "rollout/turns_max": float(max((ep.turns for ep in episodes), default=0)),
        "rollout/searches": float(sum(ep.searches for ep in episodes)),
        "rollout/fetches": float(sum(ep.fetches for ep in episodes)),
        "rollout/crops": float(sum(ep.crops for ep in episodes)),
        "rollout/invalid_actions": float(sum(ep.invalid_actions for ep in episodes)),
        "rollout/retriever_errors": float(sum(ep.retriever_errors for ep in episodes)),
        "rollout/bad_requests": float(sum(ep.bad_requests for ep in episodes)),
        "rollout/images_retrieved": float(sum(ep.images_shown for ep in episodes)),
        "rollout/visual_tokens_mean": sum(ep.visual_tokens for ep in episodes) / count,
        "rollout/images_dropped_budget": float(sum(ep.images_dropped for ep in episodes)),
        "rollout/pages_undecodable": float(sum(ep.undecodable_pages for ep in episodes)),
        "rollout/truncated": float(reasons.get("length", 0) + reasons.get("budget", 0)),
        "rollout/response_length_mean": sum(len(ep.response_ids) for ep in episodes) / count,
        "rollout/seconds": elapsed,
    }
    for reason, number in reasons.items():
        metrics[f"rollout/termination/{reason}"] = float(number)
    kinds = sum((ep.invalid_kinds for ep in episodes), Counter())
    for kind, number in sorted(kinds.items()):
        metrics[f"rollout/invalid_actions/{kind}"] = float(number)
    metrics["rollout/tool_calls_cut"] = float(sum(ep.calls_cut for ep in episodes))
    edits = sum(len(ep.segments) for ep in episodes)
    if edits:  # a context policy cut episodes into rows
        metrics["rollout/context_edits"] = float(edits)
        metrics["rollout/rows"] = float(len(episodes) + edits)
    for key, value in client_stats.items():
        metrics[f"retriever/{key}"] = float(value)
    return metrics


# The termination reason of a row an edit closed (its episode went on in the next row).
CONTEXT_EDIT = "context_edit"


def episode_columns(
    samples: Sequence[BatchRow | Episode], prompt_entries: Sequence[list], spec: BatchSpec
) -> dict[str, np.ndarray]:
    """Per-row non-tensor columns: images in sequence order (the prompt's own entries as the
    trainer gave them, then the retrieved pages as their shared `pages.PageEntry`: one object per
    distinct page in the whole batch), page ids (a segment row: those shown until it closed),
    counters (the episode's)."""
    rows = as_rows(samples)
    episodes = [row.episode for row in rows]
    columns = {
        "multi_modal_data": object_array(
            [
                {spec.image_key: list(entries) + [page.entry for page in row.part.images]}
                for row, entries in zip(rows, prompt_entries)
            ]
        ),
        "page_ids": object_array([[list(turn) for turn in row.part.page_ids] for row in rows]),
        "turn_page_ids": object_array([row.part.turn_page_ids() for row in rows]),
        # per retrieved image (after the prompt's): None, or the page fractions a crop shows
        "image_regions": object_array([list(row.part.image_regions) for row in rows]),
        "termination_reason": object_array([row.episode.termination if row.final else CONTEXT_EDIT for row in rows]),
        "budget_overflow": object_array([row.episode.budget_overflow if row.final else None for row in rows]),
        "num_turns": np.array([row.part.turns for row in rows], dtype=np.int64),
        "num_searches": np.array([ep.searches for ep in episodes], dtype=np.int64),
        "num_fetches": np.array([ep.fetches for ep in episodes], dtype=np.int64),
        "num_crops": np.array([ep.crops for ep in episodes], dtype=np.int64),
        # per sample, its tool calls answered with an error: the retriever's faults, and the
        # requests it refused as the policy's mistake (a page the document does not have)
        "retriever_errors": np.array([ep.retriever_errors for ep in episodes], dtype=np.int64),
        "bad_requests": np.array([ep.bad_requests for ep in episodes], dtype=np.int64),
    }
    if spec.segmented:
        columns["episode_id"] = np.array([row.episode.index for row in rows], dtype=np.int64)
        columns["segment_index"] = np.array([row.segment_index for row in rows], dtype=np.int64)
        columns["context_length"] = np.array([row.part.context_length for row in rows], dtype=np.int64)
    return columns
