"""The live guard (`verify/guard.py`) in verl 0.9.1's training path: every batch `vrag_agent` rolls
out is inspected before the trainer sees it, and the step's `guard/` metrics (per-turn drift
included) go to verl's logger.

Where, and why there:
- **The guard runs in the agent-loop worker, right after verl's own `_postprocess`**
  (`GuardedAgentLoopWorker._postprocess`). That is the first place the batch verl trains on is
  complete: padded rows, `response_mask`, `rollout_log_probs` and the positions verl computed
  with the family's `get_rope_index` (`_agent_loop_postprocess`), which is what the mrope check
  must see. It is also a process that already imports our loop (the registry instantiates
  `vrag_agent` there), and it holds the trajectories' images as PIL (`multi_modal_data`), so
  nothing is encoded or shipped for the check. Each worker guards its own chunk: the GRPO-group
  check sees the copies of a prompt that landed in that worker (verl's manager splits a step
  into contiguous chunks, so groups are split only at chunk edges). Validation batches are not
  guarded (nothing trains on them).
- **The worker class is chosen with verl's own extension point**:
  `actor_rollout_ref.rollout.agent.agent_loop_manager_class=<this module>.GuardedAgentLoopManager`
  (a `+key` override; verl's `AgentLoopConfig` has the field, its YAML does not). The trainer
  imports the class in its driver process, so no entry module of ours is needed: the examples
  still start `python -m verl.trainer.main_ppo`. The manager spawns `GuardedAgentLoopWorker`s and
  tells each its index (the `rank` its bad-sample files carry).
- **Metrics reach verl's logger through the driver's own metric functions.** A worker's
  `meta_info` does not survive the manager's concatenation (it keeps the first worker's), so each
  row carries its verdict in the `GUARD_COLUMN` object column, which survives verl's concat,
  union and `balance_batch` reordering. When the manager is built, `install_trainer_metrics()`
  wraps two module-level functions of verl's synchronous `RayPPOTrainer.fit` (process-local,
  idempotent): `ray_trainer.compute_data_metrics`, whose result is merged into the step's
  metrics, gains the step's counts (`guard/checked`, `guard/bad`, `guard/dropped`,
  `guard/bad/<check>`: `column_metrics` of the column); `verl.utils.debug.metrics.
  calculate_debug_metrics`, which `fit` calls right after it recomputed the actor's log-probs
  (`old_log_probs`) of a batch that has `rollout_log_probs`, gains the per-turn drift
  (`guard/drift/turn_K/mean|max`, `guard/drift/max`, `guard/drift/worst_turn`: `drift.batch_drift`
  over `response_mask`, so dropped samples are left out) and prints the worst sample-turns. Under
  `rollout_correction.bypass_mode` verl does not recompute log-probs and no drift is reported.
- **Turn ids**: the loop returns each token's turn in `extra_fields["turn_ids"]`; the worker turns
  that column into a `(B, R)` `turn_ids` tensor (0 on padding) before the guard runs, so the
  guard checks it against the loss mask and the driver's drift reads it.

Settings: the `guard*` fields of the loop's `vrag` entry (`AgentRolloutConfig`: `guard: fail |
drop | warn | off`, default `drop`; `guard_positions_fraction`; `guard_samples_dir`, by default
`guard_bad_samples/` under `trainer.default_local_dir` (beside the run's checkpoints); `guard_samples_limit`), the
model being the entry's `model_path` or `actor_rollout_ref.model.path`. `fail` raises
`GuardFailure` in the worker, which stops the step. A batch with rows of another agent loop is
not guarded (its rows are not in our action format); the worker says so once.

Not covered here: verl 0.9.1's default `trainer.use_v1=true` trainer (TransferQueue: each
trajectory is stored unpadded as it finishes and no worker ever holds the batch), which the manager
refuses, naming the settings to use: its guard is `v1_rows.GuardedRowsManager` (each trajectory
guarded in verl's v1 worker before it is stored). The examples set `trainer.use_v1=False`. The
fully asynchronous trainer's rollouter has workers of its own.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from verl.experimental.agent_loop.agent_loop import AgentLoopManager, _agent_loop_registry

from ...config import AgentRolloutConfig, guard_samples_under
from ...core.pages import pixels
from ...verify.drift import old_log_prob_drift
from ...verify.guard import LiveGuard, batch_counts
from .agent_loop import AGENT_NAME, agent_config
from .segments import MANAGER_CLASS as V1_MANAGER_CLASS  # the v1 trainer's manager (v1_rows.py)
from .segments import ragged_tensor
from .pages import PagedAgentLoopWorker

logger = logging.getLogger(__name__)
MANAGER_CLASS = "vrag_rollout.integrations.verl.guard.GuardedAgentLoopManager"
TURN_IDS = "turn_ids"  # the loop's extra_fields entry and the batch tensor made of it
_UNBUILT = object()


def guard_config(trainer_config: Any) -> tuple[str, AgentRolloutConfig]:
    """The model dir and the rollout config (its `guard*` fields) of `vrag_agent`'s registry entry,
    as the loop itself reads them (`agent_config`)."""
    entry = _agent_loop_registry.get(AGENT_NAME)
    if entry is None:
        raise ValueError(f"{AGENT_NAME} is not in verl's agent-loop registry: set "
                         "actor_rollout_ref.rollout.agent.agent_loop_config_path")
    get = entry.get if hasattr(entry, "get") else (lambda key, default=None: default)
    vrag = get("vrag") or {}
    if not isinstance(vrag, dict):
        from omegaconf import OmegaConf

        vrag = OmegaConf.to_container(vrag, resolve=True)
    model_path = get("model_path") or str(trainer_config.actor_rollout_ref.model.path)
    config = AgentRolloutConfig(**agent_config(trainer_config.actor_rollout_ref.rollout, dict(vrag)))
    trainer = getattr(trainer_config, "trainer", None)
    run_output = getattr(trainer, "default_local_dir", None) if trainer is not None else None
    return str(model_path), config.updated(guard_samples_dir=guard_samples_under(config.guard_samples_dir, run_output))


def attach_turn_ids(batch: Any) -> bool:
    """The loop's per-row `turn_ids` lists as a `(B, R)` tensor (right-padded with 0, as verl pads
    responses); the column is removed. False (nothing attached) when some row has none."""
    column = batch.non_tensor_batch.pop(TURN_IDS, None)
    if column is None or any(row is None for row in column):
        return False
    batch.batch[TURN_IDS] = ragged_tensor(column, batch.batch["responses"].shape[1])
    return True


class LiveGuardHolder:
    """A verl worker's live guard, built on first use from the loop's `vrag` entry (`guard_config`),
    numbered by the worker's index among its manager's (`set_guard_rank`: its bad-sample files'
    `.rankR`, its draws' seed). `_built(live)` is a subclass's hook on a new guard."""

    guard_rank = 0
    _live: Any = _UNBUILT

    def set_guard_rank(self, rank: int) -> None:
        self.guard_rank, self._live = int(rank), _UNBUILT

    def live_guard(self) -> Optional[LiveGuard]:
        if self._live is _UNBUILT:  # built on first use: the registry is filled in __init__
            model_path, config = guard_config(self.config)
            self._live = LiveGuard.from_config(model_path, config, rank=self.guard_rank, processor=self.processor)
            if self._live is not None:
                self._built(self._live)
        return self._live

    def _built(self, live: LiveGuard) -> None:
        pass


class GuardedAgentLoopWorker(LiveGuardHolder, PagedAgentLoopWorker):
    """verl's worker whose postprocessed batches go through the live guard (module docstring),
    its pages processed once (`pages.PagedAgentLoopWorker`)."""

    _warned_mixed = False

    def _built(self, live: LiveGuard) -> None:
        live.rederive = self.rederive_rows

    def rederive_rows(self, batch: Any, rows: list[int]) -> None:
        """What verl derived from an emptied row's tokens and images, derived again with verl's own
        code: `multi_modal_inputs` (pixels, grids, `images_seqlens`; `_compute_multi_modal_inputs`),
        `position_ids` (`_compute_position_ids`), and its `rm_scores` row (0 for the empty response,
        the project's reward of one, where verl's reward loop filled the column)."""
        from types import SimpleNamespace

        columns, t = batch.non_tensor_batch, batch.batch
        for row in rows:
            media = columns.get("multi_modal_data")
            images = [pixels(entry) for entry in ((media[row] if media is not None else None) or {}).get("images") or []]
            # as the loop hands verl a trajectory (`agent_loop._output`): no image, no data
            output = SimpleNamespace(multi_modal_data={"images": images} if images else None, mm_processor_kwargs=None)
            input_ids, attention = t["input_ids"][row:row + 1], t["attention_mask"][row:row + 1]
            try:
                inputs = self._compute_multi_modal_inputs(output, input_ids)
            finally:
                self._shared_by_output().pop(id(output), None)
            t["position_ids"][row] = self._compute_position_ids(input_ids, attention, inputs,
                                                                self._get_mm_processor_kwargs(None))[0]
            if "multi_modal_inputs" in columns:
                columns["multi_modal_inputs"][row] = inputs
            if "rm_scores" in t.keys():
                t["rm_scores"][row] = 0.0

    def _postprocess(self, inputs: list, input_non_tensor_batch: Optional[dict] = None, validate: bool = False) -> Any:
        batch = super()._postprocess(inputs, input_non_tensor_batch=input_non_tensor_batch, validate=validate)
        attach_turn_ids(batch)
        if not validate:
            self.guard_batch(batch)
        return batch

    def guard_batch(self, batch: Any) -> dict[str, float]:
        """Inspect and act on `batch` in place (`LiveGuard`); the step's `guard/` metrics."""
        live = self.live_guard()
        if live is None:
            return {}
        names = batch.non_tensor_batch.get("agent_name")
        if names is not None and any(name != AGENT_NAME for name in names):
            if not self._warned_mixed:
                logger.warning("guard: a batch with rows of other agent loops is not guarded")
                self._warned_mixed = True
            return {}
        metrics = live(batch)
        report = live.last
        if report is not None and not report.ok:
            logger.warning("guard (%s): %d of %d samples bad, %s: %s", live.mode, len(report.failures), report.samples,
                           "dropped" if live.mode == "drop" else "kept", " | ".join(report.lines(3)))
        return metrics


class GuardedAgentLoopManager(AgentLoopManager):
    """verl's agent-loop manager with `GuardedAgentLoopWorker`s; installs the driver's metric hooks."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any):
        if config.trainer.get("use_v1", False):
            raise ValueError("GuardedAgentLoopManager guards verl's synchronous trainer (trainer.use_v1=False): verl "
                             "0.9.1's v1 trainer stores each trajectory in its TransferQueue and never builds the "
                             "batch in a worker. For the v1 trainer set "
                             f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={V1_MANAGER_CLASS} (the "
                             "guard in verl's v1 worker, segment rows or not); or set trainer.use_v1=False")
        import ray

        self.agent_loop_workers_class = ray.remote(GuardedAgentLoopWorker)
        super().__init__(config, *args, **kwargs)
        install_trainer_metrics()

    async def _init_agent_loop_workers(self) -> None:
        import asyncio

        await super()._init_agent_loop_workers()
        await asyncio.gather(*[worker.set_guard_rank.remote(rank) for rank, worker in enumerate(self.agent_loop_workers)])


# ---- the driver's side: metrics into the step's dict ----
def _with_guard_counts(compute_data_metrics: Any) -> Any:
    def wrapped(batch: Any, *args: Any, **kwargs: Any) -> dict:
        return {**compute_data_metrics(batch, *args, **kwargs), **batch_counts(batch)}

    wrapped.vrag_guard = True
    wrapped.__wrapped__ = compute_data_metrics
    wrapped.rewrap = _with_guard_counts  # what wraps another inner function the same way (turn_estimators)
    return wrapped


def _with_drift(calculate_debug_metrics: Any) -> Any:
    def wrapped(data: Any, *args: Any, **kwargs: Any) -> dict:
        return {**calculate_debug_metrics(data, *args, **kwargs), **old_log_prob_drift(data)}

    wrapped.vrag_guard = True
    wrapped.__wrapped__ = calculate_debug_metrics
    return wrapped


def install_trainer_metrics() -> None:
    """Wrap verl's `ray_trainer.compute_data_metrics` and `debug.metrics.calculate_debug_metrics`
    (module docstring); a second call changes nothing."""
    import verl.trainer.ppo.ray_trainer as ray_trainer
    import verl.utils.debug.metrics as debug_metrics

    if not getattr(ray_trainer.compute_data_metrics, "vrag_guard", False):
        ray_trainer.compute_data_metrics = _with_guard_counts(ray_trainer.compute_data_metrics)
    if not getattr(debug_metrics.calculate_debug_metrics, "vrag_guard", False):
        debug_metrics.calculate_debug_metrics = _with_drift(debug_metrics.calculate_debug_metrics)
    from .turn_estimators import patch_compute_advantage

    patch_compute_advantage()  # the turn-level estimators (vrag_turn, vrag_gigpo) get the batch's columns


__all__ = ["GuardedAgentLoopManager", "GuardedAgentLoopWorker", "MANAGER_CLASS", "attach_turn_ids",
           "guard_config", "install_trainer_metrics"]
