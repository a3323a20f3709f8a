"""`AutoRewardManager.compute_reward` patch: what EasyR1's reward manager sees of an agent batch,
where the score lands, and which metrics it returns.

EasyR1's reward managers decode `responses[:response_mask.sum()]`, pass the reward function
`{response, response_length, ground_truth}` and put the score at `response_mask.sum() - 1`.
With the agent's mask (observations zeroed) that decodes a truncated response and puts the score
mid-sequence. The patched `compute_reward`:

1. scores a *view* of the batch (the trainer's batch is not modified) whose `response_mask` is the
   response part of `attention_mask` (the whole episode, observations included), and whose
   `ground_truth`, where it is a JSON object (what `vrag-rollout convert-dataset` writes), also
   holds the episode's `page_ids` (the rollout's column, or `vrag_baseline_page_ids` for the ReMax
   baseline), so the reward function can score retrieval;
2. moves each row's score from the last response token to the last *sampled* token (the last 1 of
   the trainer's `response_mask`) when they differ: a response that ends on an observation (one
   that exactly filled the budget) would otherwise carry its reward on a masked token, which
   every estimator multiplies by 0 or skips;
3. adds the agent's batch metrics (`vrag_metrics` column, see `rollout_adapter`) to the returned
   reward metrics as `agent/<name>` (one value per row; a key missing from some worker's dict
   counts 0 there). The trainer logs reward metrics as `reward/<key>` (mean over rows) and in
   validation as `val/<key>_reward`.

For EasyR1's own rollout (masks equal, no JSON ground truth, no metrics column) the batch is
scored exactly as without the patch.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

from ...core.reward import shown_pages
from .common import BASELINE_PAGES_COLUMN, METRICS_COLUMN, mark_patched, patch_once

METRIC_PREFIX = "agent/"


def with_page_ids(ground_truth: Any, page_ids: Any) -> Any:
    """The ground truth with `page_ids` added, if it is a JSON object with an `answer`; else as is."""
    if not isinstance(ground_truth, str) or not ground_truth.lstrip().startswith("{"):
        return ground_truth
    try:
        truth = json.loads(ground_truth)
    except json.JSONDecodeError:
        return ground_truth
    if not isinstance(truth, dict) or "answer" not in truth:
        return ground_truth
    truth["page_ids"] = shown_pages(page_ids)
    return json.dumps(truth, ensure_ascii=False)


def _page_column(columns: dict) -> Optional[Any]:
    if "page_ids" in columns:
        return columns["page_ids"]
    return columns.get(BASELINE_PAGES_COLUMN)


def reward_view(data: Any) -> Any:
    """`data` as the reward manager should score it (steps 1 of the module docstring)."""
    import numpy as np
    import torch

    batch, columns = data.batch, dict(data.non_tensor_batch)
    changed = False
    pages = _page_column(columns)
    if pages is not None and "ground_truth" in columns:
        truths = np.empty(len(pages), dtype=object)
        truths[:] = [with_page_ids(g, p) for g, p in zip(columns["ground_truth"], pages)]
        if any(a is not b for a, b in zip(truths, columns["ground_truth"])):
            columns["ground_truth"] = truths
            changed = True
    if batch is not None and "responses" in batch.keys() and "attention_mask" in batch.keys():
        width = batch["responses"].shape[-1]
        full = batch["attention_mask"][:, -width:]
        current = batch.get("response_mask") if "response_mask" in batch.keys() else None
        if current is not None:
            full = full.to(current.dtype)
        if current is None or not torch.equal(full, current):
            batch = batch.clone(recurse=False) if hasattr(batch, "clone") else dict(batch)
            batch["response_mask"] = full
            changed = True
    if not changed:
        return data
    return type(data)(batch=batch, non_tensor_batch=columns, meta_info=data.meta_info)


def full_response_view(data: Any) -> Any:
    """Kept name: the reward view (see `reward_view`)."""
    return reward_view(data)


def place_on_last_sampled(scores: Any, sampled_mask: Any, full_mask: Any) -> Any:
    """Move each row's score from its last response token to its last sampled token (step 2)."""
    import torch

    if not isinstance(scores, torch.Tensor) or scores.shape != sampled_mask.shape:
        return scores
    positions = torch.arange(scores.shape[-1])
    last_full = torch.where(full_mask.bool(), positions, -1).max(dim=-1).values
    last_sampled = torch.where(sampled_mask.bool(), positions, -1).max(dim=-1).values
    moved = scores.clone()
    for row in torch.nonzero((last_full != last_sampled) & (last_sampled >= 0) & (last_full >= 0)).flatten().tolist():
        src, dst = int(last_full[row]), int(last_sampled[row])
        moved[row, dst] += moved[row, src]
        moved[row, src] = 0.0
    return moved


def agent_metrics(data: Any) -> dict:
    """{`agent/<name>`: one value per row} from the `vrag_metrics` column (step 3)."""
    column = data.non_tensor_batch.get(METRICS_COLUMN)
    if column is None:
        return {}
    rows = [row if isinstance(row, dict) else {} for row in column]
    names = sorted({name for row in rows for name in row})
    return {METRIC_PREFIX + name: [float(row.get(name, 0.0)) for row in rows] for name in names}


def make_agent_reward(original: Callable) -> Callable:
    def compute_reward(self, data):
        view = reward_view(data)
        result = original(self, view)
        if not (isinstance(result, tuple) and len(result) == 2):
            return result
        scores, metrics = result
        batch = data.batch
        if batch is not None and "response_mask" in batch.keys() and view is not data:
            scores = place_on_last_sampled(scores, batch["response_mask"], view.batch["response_mask"])
        extra = agent_metrics(data)
        if extra:
            metrics = dict(metrics)
            metrics.update(extra)
        return scores, metrics

    compute_reward.__doc__ = original.__doc__
    return mark_patched(compute_reward, original)


def patch_reward(module: Any) -> dict:
    return {"reward_view": patch_once(module.AutoRewardManager, "compute_reward", make_agent_reward)}
