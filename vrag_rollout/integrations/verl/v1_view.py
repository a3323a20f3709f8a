"""A v1 trajectory's rows as the live guard reads them, and a dropped trajectory's rows emptied
(`v1_rows.GuardedRowsWorker`).

verl's v1 worker stores each output of a trajectory as its own unpadded row. The guard checks
batches in verl's legacy padded layout, so `rows_view` lays the trajectory's rows out that way
from what verl stores: left-padded prompts, right-padded responses (`response_length` wide), the
positions verl derived at their tokens (`Derived`), `loss_mask` = `response_mask`, the loop's extra
fields as columns (`turn_ids` and a segment batch's `sampled_mask` as tensors). `empty_outputs`
empties a dropped trajectory's outputs in place as `verify/emptying.py` empties the view's rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from ...verify.emptying import PAGE_COLUMNS, empty_samples
from .guard import attach_turn_ids
from .segments import SAMPLED_MASK, segment_tensors


@dataclass
class Derived:
    """verl's v1 derivation of one output's row: what its `_agent_loop_postprocess` stores."""

    output: Any
    input_ids: torch.Tensor  # (L,) prompt + response
    multi_modal_inputs: Any
    position_ids: Optional[torch.Tensor]  # (4, L) mrope, or (L,); None where verl's derivation raised
    error: Optional[BaseException] = None  # what it raised (the row's tokens and images disagree)


def _object_column(values: list) -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):  # not column[:] = values: equal-length lists would broadcast
        column[i] = value
    return column


def rows_view(outputs: list, derived: list[Derived], kwargs: dict, pad_id: int,
              response_length: Optional[int] = None) -> Any:
    """A trajectory's rows as the guard reads a batch (verl's legacy padded layout: responses
    `response_length` wide, or as wide as the longest, which the guard reports), made of what verl's
    v1 worker stores: each row's tokens, masks and log-probs, its derived `position_ids` at its
    tokens, `loss_mask` = `response_mask`; the outputs' extra fields as columns (`turn_ids` and
    `sampled_mask` as tensors), and the trajectory's `uid`, `session_id`, `global_steps`."""
    from verl.protocol import DataProto

    size = len(outputs)
    P = max(len(output.prompt_ids) for output in outputs)
    R = max([len(output.response_ids) for output in outputs] + [int(response_length or 0)])
    prompts = torch.full((size, P), pad_id, dtype=torch.long)
    responses = torch.full((size, R), pad_id, dtype=torch.long)
    attention = torch.zeros((size, P + R), dtype=torch.long)
    response_mask = torch.zeros((size, R), dtype=torch.long)
    with_logprobs = all(output.response_logprobs is not None for output in outputs)
    logprobs = torch.zeros((size, R), dtype=torch.float32) if with_logprobs else None
    # 1 on padding, as verl's legacy `_compute_position_ids` leaves it (transformers' rope index too)
    lead = next((row.position_ids.shape[:-1] for row in derived if row.position_ids is not None), (4,))
    positions = torch.ones((size, *lead, P + R), dtype=torch.long)
    for s, (output, row) in enumerate(zip(outputs, derived)):
        p, r = len(output.prompt_ids), len(output.response_ids)
        prompts[s, P - p:] = row.input_ids[:p]
        responses[s, :r] = row.input_ids[p:]
        attention[s, P - p:P + r] = 1
        response_mask[s, :r] = torch.as_tensor(output.response_mask, dtype=torch.long)
        if logprobs is not None:
            logprobs[s, :r] = torch.as_tensor(output.response_logprobs, dtype=torch.float32)
        if row.position_ids is not None:
            positions[s, ..., P - p:P] = row.position_ids[..., :p]
            positions[s, ..., P:P + r] = row.position_ids[..., p:]
    tensors = {"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
               "attention_mask": attention, "response_mask": response_mask, "loss_mask": response_mask.clone(),
               "position_ids": positions}
    if logprobs is not None:
        tensors["rollout_log_probs"] = logprobs
    names = list(dict.fromkeys(name for output in outputs for name in output.extra_fields))
    columns = {name: _object_column([output.extra_fields.get(name) for output in outputs]) for name in names}
    for name in ("uid", "session_id", "global_steps"):
        columns[name] = _object_column([kwargs.get(name)] * size)
    batch = DataProto.from_dict(tensors=tensors)
    batch.non_tensor_batch.update(columns)
    attach_turn_ids(batch)
    segment_tensors(batch)  # segment rows: `sampled_mask` as a tensor, the segment columns as integers
    return batch


def empty_outputs(outputs: list, view: Any, guard: Any, band: dict, pad_id: int) -> None:
    """Empty every row of a dropped trajectory in place, as `emptying.empty_samples` empties the
    rows of `view` (the rows as the guard read them): the prompt as it leaves it (its images kept
    when their pad runs match them), one pad token of response out of the loss (verl's v1 row needs
    a token: its reward goes on the last one), log-prob 0, no page, no turn; each row's
    `extra_fields` a new dict (the loop's is left as it was)."""
    empty_samples(view, list(range(len(outputs))), guard, band)
    columns, width = view.non_tensor_batch, int(view.batch["prompts"].shape[1])
    media = columns.get("multi_modal_data")
    for s, output in enumerate(outputs):
        attended = view.batch["attention_mask"][s, :width].bool()
        kept = list(((media[s] if media is not None else None) or {}).get("images") or [])
        images = list((output.multi_modal_data or {}).get("images") or [])[:len(kept)]
        extra = dict(output.extra_fields)
        for name in ("multi_modal_data", "tool_extra_fields", *PAGE_COLUMNS):
            if name in extra and name in columns:
                extra[name] = columns[name][s]
        for name, value in (("image_regions", []), ("turn_ids", [0]), (SAMPLED_MASK, [0]), ("context_length", 0)):
            if name in extra:
                extra[name] = value
        output.prompt_ids = view.batch["prompts"][s][attended].tolist()
        output.response_ids, output.response_mask = [pad_id], [0]
        if output.response_logprobs is not None:
            output.response_logprobs = [0.0]
        output.multi_modal_data = {"images": images} if images else None  # as the loop hands verl a row
        output.extra_fields = extra


__all__ = ["Derived", "empty_outputs", "rows_view"]
