"""The live guard in an EasyR1 run: every rollout batch inspected in its worker, the step's
`guard/` metrics (counts and per-turn drift) in the trainer's logger.

Two places, because EasyR1 computes what the guard needs in two processes:
* in each rollout worker, the adapter (`rollout_adapter.EasyR1RolloutAdapter`) holds a
  `verify.guard.LiveGuard` built from `worker.rollout`'s `guard*` fields (`guard_for`) and runs it
  on the agent's output before EasyR1 sees it: `fail` raises there (the step stops with the
  report), `drop` zeroes a bad sample's `loss_mask`/`response_mask` (EasyR1's loss reads
  `response_mask`), and each row's verdict rides in the `vrag_guard` column;
* in the trainer's process, `verl.trainer.ray_trainer.compute_data_metrics` (called once a step,
  on the whole batch, after the actor's `compute_log_probs` added `old_log_probs`) is wrapped to
  add `step_metrics(batch)`: the counts summed over every worker's rows (`guard/checked`,
  `guard/bad`, `guard/dropped`, `guard/bad/<check>`) and, where the batch has the rollout's
  log-probs (`calculate_log_probs: true`), the per-turn gap between them and `old_log_probs`
  (`guard/drift/turn_K/mean|max`, `guard/drift/max`, `guard/drift/worst_turn`). The worst
  sample-turns are printed, one line a step. Its keys reach `logger.log` as they are (EasyR1
  logs that dict unprefixed).
The first bad samples of the run are saved by each worker under `guard_samples_dir`
(`verify.guard.BadSampleLog`; `vrag-rollout view` opens them).
"""

from __future__ import annotations

from typing import Any, Optional

from ...verify.drift import old_log_prob_drift
from ...verify.guard import LiveGuard, batch_counts
from .common import mark_patched, patch_once


def data_parallel_rank() -> int:
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    except Exception:  # noqa: BLE001 - no process group: one rank
        return 0


def guard_for(model_path: str, config: Any, processor: Any = None) -> Optional[LiveGuard]:
    """The worker's `LiveGuard` (None with `guard: off`)."""
    return LiveGuard.from_config(model_path, config, rank=data_parallel_rank(), processor=processor)


def step_metrics(batch: Any) -> dict[str, float]:
    """The step's `guard/` metrics from the whole trainer batch (see the module docstring)."""
    return {**batch_counts(batch), **old_log_prob_drift(batch)}


def patch_trainer_metrics(module: Any) -> dict:
    """Wrap `compute_data_metrics` in `verl.trainer.ray_trainer` (idempotent)."""

    def make(original: Any) -> Any:
        def compute_data_metrics(batch: Any, *args: Any, **kwargs: Any) -> dict:
            return {**original(batch, *args, **kwargs), **step_metrics(batch)}

        return mark_patched(compute_data_metrics, original)

    return {"guard_metrics": patch_once(module, "compute_data_metrics", make)}


__all__ = ["data_parallel_rank", "guard_for", "patch_trainer_metrics", "step_metrics"]
