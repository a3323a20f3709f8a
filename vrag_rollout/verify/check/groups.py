"""The GRPO check ("grpo"): the samples of one prompt are not all identical.

Contract: `check_groups(saved)` groups the samples of one prompt (by the `uid` column, else by
the config's `n`, else by equal adjacent prompts and `doc_id`) and fails
- each sample of a group whose prompt tokens differ from the group's prompt (the one most of its
  samples share; the first sample's on a tie): a sample given another prompt's uid, or an
  n-chunk that is not one prompt's samples, would be scored against the wrong group's mean;
- each group of two or more whose real response tokens are identical (zero advantage for the
  whole group). At temperature 0 this part is skipped with a note (greedy samples are identical
  by design).
It returns (failures, notes).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from ..saved_batch import SavedBatch
from .report import Failure


def _groups(saved: SavedBatch) -> list[list[int]]:
    size = len(saved)
    uids = saved.columns.get("uid")
    if uids is not None:
        groups: dict[Any, list[int]] = {}
        for row, uid in enumerate(uids):
            groups.setdefault(str(uid), []).append(row)
        return list(groups.values())
    n = saved.config.get("n")
    if isinstance(n, int) and n > 1 and size % n == 0:
        return [list(range(start, start + n)) for start in range(0, size, n)]
    prompts, docs = saved.tensors["prompts"], saved.column("doc_id")
    out: list[list[int]] = []
    for row in range(size):
        if out and torch.equal(prompts[row], prompts[out[-1][0]]) and docs[row] == docs[out[-1][0]]:
            out[-1].append(row)
        else:
            out.append([row])
    return out


def _strangers(saved: SavedBatch, group: list[int]) -> list[Failure]:
    """The samples of `group` whose attended prompt tokens are not the group's prompt."""
    t = saved.tensors
    prompts = [tuple(torch.masked_select(t["prompts"][row], t["attention_mask"][row, : t["prompts"].shape[1]].bool())
                     .tolist()) for row in group]
    counts = Counter(prompts)
    common = max(counts.values())
    shared = next(prompt for prompt in prompts if counts[prompt] == common)  # first of the most shared
    return [Failure("grpo", row, None, f"its prompt differs from the prompt of its group {group} (by "
                    f"{'uid' if 'uid' in saved.columns else 'position'}): it would be scored against another "
                    "prompt's samples")
            for row, prompt in zip(group, prompts) if prompt != shared]


def check_groups(saved: SavedBatch) -> tuple[list[Failure], list[str]]:
    groups = [group for group in _groups(saved) if len(group) > 1]
    fails = [failure for group in groups for failure in _strangers(saved, group)]
    temperature = saved.config.get("temperature")
    if temperature == 0:
        return fails, ["GRPO check skipped: temperature 0 (greedy samples are identical by design)"]
    t = saved.tensors
    for group in groups:
        # masked_select, not boolean indexing: the same values, and ~40x faster on CPU at 8k tokens.
        responses = [torch.masked_select(t["responses"][row], t["attention_mask"][row, t["prompts"].shape[1]:].bool())
                     for row in group]
        if all(torch.equal(responses[0], other) for other in responses[1:]):
            fails.append(Failure("grpo", group[0], int(t["prompts"].shape[1]),
                                 f"the {len(group)} samples {group} of one prompt are identical at every response "
                                 "position: zero advantage for the whole group"))
    return fails, []
