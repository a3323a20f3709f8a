"""The live guard's verdicts into verl's v1 step metrics (the driver's side of `v1_rows.py`).

The verdict goes in each row as its own TransferQueue field `vrag_guard` (`GUARD_COLUMN`: the
legacy path's per-row numbers, `checked`, `bad`, `dropped`, `emptied`, `bad/<check>`, ...): the
outputs are handed to verl as `GuardedOutput`s, whose `as_dict` (what verl stores) dumps it. verl's
v1 trainer logs no per-row field of its own accord (`extra_fields` and `reward_extra_info` reach
its metrics only in validation), so the manager wraps two module-level functions of
`verl.trainer.ppo.v1.trainer_base` in the driver (`install_v1_metrics`, process-local,
idempotent): `get_metric_data_with_optional_routed_experts`, which `_compute_metrics` calls for
the step's rows, also reads their `vrag_guard` field (small: never the rows' `extra_fields`, which
hold the pages' bytes) into one tensor column per count, and `compute_data_metrics`, whose result
goes into the step's metrics, sums those columns over the step's real rows (verl's padding rows
are left out) as `guard/checked`, `guard/bad`, `guard/dropped`, `guard/emptied`,
`guard/bad/<check>`. The per-turn drift of the legacy path (`guard/drift/...`) is not reported:
the rows verl reads back there carry no turn ids.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ...verify.guard import GUARD_COLUMN

logger = logging.getLogger(__name__)
GUARD_FIELD = GUARD_COLUMN  # each stored row's verdict (a TransferQueue field)
_PREFIX = f"{GUARD_FIELD}/"


def verdict_columns(verdicts: list) -> dict[str, torch.Tensor]:
    """Per count name (`checked`, `bad/<check>`, ...), a `(B,)` float column of the rows' verdicts
    (a name missing from a row, or a row without a verdict, is 0), named `vrag_guard/<name>`."""
    names = sorted({name for verdict in verdicts for name in (verdict or {})})
    return {f"{_PREFIX}{name}": torch.tensor([float((verdict or {}).get(name, 0.0)) for verdict in verdicts])
            for name in names}


def _with_verdicts(get_metric_data: Any) -> Any:
    import inspect

    signature = inspect.signature(get_metric_data)
    warned: list = []

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        data = get_metric_data(*args, **kwargs)
        bound = signature.bind(*args, **kwargs).arguments
        try:
            stored = bound["kv_batch_get"](keys=bound["keys"], partition_id=bound["partition_id"],
                                           select_fields=[GUARD_FIELD])
            verdicts = stored[GUARD_FIELD].tolist()
        except (KeyError, ValueError, RuntimeError) as error:  # rows no guarded worker stored
            if not warned:
                logger.warning("guard: the step's rows have no %s field (%s): no guard/ metrics", GUARD_FIELD, error)
                warned.append(True)
            return data
        for name, column in verdict_columns(verdicts).items():
            data[name] = column
        return data

    wrapped.vrag_guard = True
    wrapped.__wrapped__ = get_metric_data
    return wrapped


def guard_counts(batch: Any) -> dict[str, float]:
    """The step's `guard/` counts from a metrics batch's `vrag_guard/<name>` columns ({} without)."""
    tensors = batch.batch
    return {f"guard/{key[len(_PREFIX):]}": float(tensors[key].sum()) for key in sorted(tensors.keys())
            if isinstance(key, str) and key.startswith(_PREFIX)}


def _with_counts(compute_data_metrics: Any) -> Any:
    def wrapped(batch: Any, *args: Any, **kwargs: Any) -> dict:
        return {**compute_data_metrics(batch, *args, **kwargs), **guard_counts(batch)}

    wrapped.vrag_guard = True
    wrapped.__wrapped__ = compute_data_metrics
    return wrapped


def install_v1_metrics() -> None:
    """Wrap verl's v1 `trainer_base.get_metric_data_with_optional_routed_experts` and
    `trainer_base.compute_data_metrics` (module docstring); a second call changes nothing."""
    import verl.trainer.ppo.v1.trainer_base as trainer_base

    if not getattr(trainer_base.get_metric_data_with_optional_routed_experts, "vrag_guard", False):
        trainer_base.get_metric_data_with_optional_routed_experts = _with_verdicts(
            trainer_base.get_metric_data_with_optional_routed_experts)
    if not getattr(trainer_base.compute_data_metrics, "vrag_guard", False):
        trainer_base.compute_data_metrics = _with_counts(trainer_base.compute_data_metrics)


__all__ = ["GUARD_FIELD", "guard_counts", "install_v1_metrics", "verdict_columns"]
