"""The episode check of a segmented batch ("segments"): rows cut from one episode by context edits.

A batch with an `episode_id` column holds, per episode, its rows in order (`segment_index` 0, 1,
...; adjacent), every earlier row ended by an edit (`termination_reason` "context_edit") and the
last by the episode's own end. Each row's response part begins with `context_length` tokens of
context. Contract: `check_segments(saved)` returns (failures, notes) and fails
- a row whose `loss_mask` is not its `sampled_mask` with the context cut off, or whose rollout
  log-probs are not 0 in the context (the context was sampled under another context: its tokens
  are never trained on in this row);
- an episode whose rows are not adjacent, not numbered 0..k-1 in order, whose first row has a
  context, whose rows' prompts differ, or whose earlier rows do not end with an edit (or whose
  last does);
- a row (after the first) whose context does not hold every token the policy sampled in the
  previous row, verbatim, in order, with the same turn ids: an edit may replace what the engine
  was shown, never what the policy wrote.
That each row is exactly what the engine saw (the edited context included) is the forward check's
part: the rollout log-probs of the row's own turns are recomputed over the row as stored.
"""

from __future__ import annotations

from typing import Any

import torch

from ..saved_batch import SavedBatch
from .report import Failure

CONTEXT_EDIT = "context_edit"  # the termination reason of a row an edit closed (batch.CONTEXT_EDIT)


def episodes_of(saved: SavedBatch) -> dict[int, list[int]]:
    """episode id -> its rows in batch order (empty for a batch without segments)."""
    ids = saved.columns.get("episode_id")
    out: dict[int, list[int]] = {}
    for row, episode in enumerate(ids if ids is not None else []):
        out.setdefault(int(episode), []).append(row)
    return out


def check_segments(saved: SavedBatch) -> tuple[list[Failure], list[str]]:
    episodes = episodes_of(saved)
    if not episodes:
        return [], []
    t = saved.tensors
    if "sampled_mask" not in t or "context_length" not in saved.columns or "segment_index" not in saved.columns:
        return [Failure("segments", None, None, "an episode_id column without sampled_mask, segment_index and "
                        "context_length: the rows' contexts cannot be told from their own turns")], []
    fails = [f for row in range(len(saved)) for f in _row_masks(saved, row)]
    for episode, rows in episodes.items():
        fails += _episode(saved, episode, rows)
    segmented = sum(1 for rows in episodes.values() if len(rows) > 1)
    return fails, [f"{len(episodes)} episodes in {len(saved)} rows ({segmented} cut by context edits)"]


def _row_masks(saved: SavedBatch, row: int) -> list[Failure]:
    t, P = saved.tensors, int(saved.tensors["prompts"].shape[1])
    context = int(saved.columns["context_length"][row])
    sampled, loss = t["sampled_mask"][row].long(), t["loss_mask"][row].long()
    expected = sampled.clone()
    expected[:context] = 0
    bad = (loss != expected).nonzero().flatten()
    if len(bad):
        k = int(bad[0])
        where = "inside its context" if k < context else "in its own turns"
        return [Failure("segments", row, P + k, f"loss_mask {int(loss[k])} {where}, expected {int(expected[k])} "
                        f"(sampled_mask {int(sampled[k])}, context_length {context})")]
    log_probs = t.get("rollout_log_probs")
    if log_probs is not None and context and bool((log_probs[row, :context] != 0).any()):
        k = int((log_probs[row, :context] != 0).nonzero()[0])
        return [Failure("segments", row, P + k, "a rollout log-prob inside the row's context (sampled under "
                        "another context: it must be 0 and out of the loss)")]
    return []


def _episode(saved: SavedBatch, episode: int, rows: list[int]) -> list[Failure]:
    columns = saved.columns
    first = rows[0]
    if rows != list(range(first, first + len(rows))):
        return [Failure("segments", first, None, f"episode {episode}'s rows {rows} are not adjacent")]
    indices = [int(columns["segment_index"][row]) for row in rows]
    if indices != list(range(len(rows))):
        return [Failure("segments", first, None, f"episode {episode}'s rows are numbered {indices}, not 0..{len(rows) - 1}")]
    fails = []
    if int(columns["context_length"][first]):
        fails.append(Failure("segments", first, None, f"episode {episode}'s first row has a context of "
                             f"{int(columns['context_length'][first])} tokens: nothing came before it"))
    reasons = [str(columns["termination_reason"][row]) for row in rows]
    for row, reason in zip(rows[:-1], reasons[:-1]):
        if reason != CONTEXT_EDIT:
            fails.append(Failure("segments", row, None, f"an earlier row of episode {episode} ended {reason!r}, "
                                 f"not {CONTEXT_EDIT!r}: the episode went on after it"))
    if reasons[-1] == CONTEXT_EDIT:
        fails.append(Failure("segments", rows[-1], None, f"episode {episode}'s last row ended by an edit: its "
                             "later rows are missing"))
    prompt = _prompt(saved, first)
    fails += [Failure("segments", row, None, f"its prompt differs from episode {episode}'s first row's")
              for row in rows[1:] if not torch.equal(_prompt(saved, row), prompt)]
    for before, after in zip(rows, rows[1:]):
        fails += _context_holds(saved, before, after)
    return fails


def _prompt(saved: SavedBatch, row: int) -> torch.Tensor:
    t = saved.tensors
    P = t["prompts"].shape[1]
    return torch.masked_select(t["prompts"][row], t["attention_mask"][row, :P].bool())


def _sampled(saved: SavedBatch, row: int, end: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, turn ids) the policy sampled in `row` (before response position `end`)."""
    t = saved.tensors
    mask = t["sampled_mask"][row, :end].bool()
    turns = t["turn_ids"][row, :end] if "turn_ids" in t else torch.zeros_like(mask, dtype=torch.long)
    return torch.masked_select(t["responses"][row, :end], mask), torch.masked_select(turns, mask)


def _context_holds(saved: SavedBatch, before: int, after: int) -> list[Failure]:
    P = int(saved.tensors["prompts"].shape[1])
    context = int(saved.columns["context_length"][after])
    wrote, wrote_turns = _sampled(saved, before)
    held, held_turns = _sampled(saved, after, context)
    if torch.equal(wrote, held) and torch.equal(wrote_turns, held_turns):
        return []
    common = min(len(wrote), len(held))
    differ = ((wrote[:common] != held[:common]) | (wrote_turns[:common] != held_turns[:common])).nonzero().flatten()
    k = int(differ[0]) if len(differ) else common
    position = torch.nonzero(saved.tensors["sampled_mask"][after, :context]).flatten()
    at = P + int(position[k]) if k < len(position) else P + context
    return [Failure("segments", after, at, f"its context does not hold row {before}'s sampled tokens verbatim "
                    f"(sampled token {k} of {len(wrote)} differs or is missing; the context holds {len(held)})")]
