"""verl 0.9.1's v1 agent-loop manager and worker, fit for an episode's several rows (`segments.py`).

Set `actor_rollout_ref.rollout.agent.agent_loop_manager_class=` `MANAGER_CLASS` (a `+key`
override) with `trainer.use_v1=True` to train on a context policy's rows. The worker is verl's
`AgentLoopWorkerTQ` (each output its own TransferQueue row, the reward copied from the last row to
the earlier ones) with one change: the reward is computed on the last output alone.
verl's `AgentLoopWorker._compute_score` builds a batch of all of a trajectory's outputs and pads
their position ids with `pad_sequence`, which fails on the Qwen VL families' `(4, L)` mrope
positions as soon as two rows differ in length ("The size of tensor a (368) must match the size of
tensor b (609) at non-singleton dimension 1"); every reward manager of verl 0.9.1 reads only that
batch's last row (`data[-1:]`, as does the discriminative reward model's path), so scoring the
last output alone gives the same reward. Importing this module imports TransferQueue (verl's v1).
"""

from __future__ import annotations

from typing import Any

from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

MANAGER_CLASS = "vrag_rollout.integrations.verl.v1_rows.SegmentRowsManager"

# verl decorates its v1 worker with @ray.remote: the class it wraps is the one to extend
_V1_WORKER = AgentLoopWorkerTQ.__ray_metadata__.modified_class.__ray_actor_class__


class SegmentRowsWorker(_V1_WORKER):
    """verl's v1 worker, scoring a trajectory's outputs by the last one alone (module docstring)."""

    async def _compute_score(self, outputs: list, kwargs: dict) -> None:
        await super()._compute_score(outputs[-1:], kwargs=kwargs)


class SegmentRowsManager(AgentLoopManagerTQ):
    """verl's v1 agent-loop manager spawning `SegmentRowsWorker`s."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        import ray

        self.agent_loop_workers_class = ray.remote(SegmentRowsWorker)  # the workers start in create()


__all__ = ["MANAGER_CLASS", "SegmentRowsManager", "SegmentRowsWorker"]
