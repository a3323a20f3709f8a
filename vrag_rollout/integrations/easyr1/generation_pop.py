"""`DataProto.pop` patch: the trainer's generation pop also copies the dataset columns the agent
needs (default `doc_id`) into the generation batch, and marks a training generation batch.

Only a pop that takes `raw_prompt_ids` (train and validation generation) is affected. The
columns are copied, not moved: the trainer batch keeps them for the reward and the union, so the
rollout must return them unchanged (repeated n times) or not at all. The mark
(`meta_info["vrag_generation_pop"]`) lets the adapter recognise the ReMax baseline call, a copy
of this batch (`estimators.is_remax_baseline`); validation replaces the meta_info, so it is not marked.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Sequence

from .common import DEFAULT_GENERATION_KEYS, GENERATION_KEYS_ENV, GENERATION_MARK, mark_patched, patch_once


def generation_keys() -> tuple:
    """Extra non-tensor columns copied into the generation batch (env `VRAG_GENERATION_KEYS`)."""
    raw = os.environ.get(GENERATION_KEYS_ENV)
    if raw is None:
        return DEFAULT_GENERATION_KEYS
    return tuple(key.strip() for key in raw.split(",") if key.strip())


def make_generation_pop(original: Callable, keys: Optional[Callable[[], Sequence[str]]] = None) -> Callable:
    """Wrap `DataProto.pop` (see the module docstring)."""
    keys = keys or generation_keys

    def pop(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None):
        out = original(self, batch_keys=batch_keys, non_tensor_batch_keys=non_tensor_batch_keys,
                       meta_info_keys=meta_info_keys)
        if non_tensor_batch_keys and "raw_prompt_ids" in non_tensor_batch_keys:
            for key in keys():
                if key in self.non_tensor_batch and key not in out.non_tensor_batch:
                    out.non_tensor_batch[key] = self.non_tensor_batch[key].copy()
            out.meta_info[GENERATION_MARK] = True
        return out

    pop.__doc__ = original.__doc__
    return mark_patched(pop, original)


def patch_protocol(module: Any) -> dict:
    return {"generation_columns": patch_once(module.DataProto, "pop", make_generation_pop)}
