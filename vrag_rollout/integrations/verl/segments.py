"""Context edits in verl: an episode's segment rows, one `AgentLoopOutput` each, for verl 0.9.1's v1 trainer.

Under a context policy (`context_keep_turns` / `context_keep_pages`) an episode is several training
rows (`core.context_edit`: each edit closes a segment; `core.batch.batch_rows` gives an episode's
rows, its closed segments then its current row). `VragAgentLoop.run` then returns a list of
outputs, one per row in order (`row_outputs`). Each output is the row exactly as `core.batch`
builds it for the EasyR1 rollout:
- `prompt_ids`: the episode's prompt; `response_ids`: the row's tokens, its context first;
- `response_mask`: the row's loss mask, the context (`context_length` tokens, sampled under another
  context) cut off; `response_logprobs`: 0 on the context and on observations;
- `multi_modal_data["images"]`: the prompt's images, then exactly the row's images in sequence
  order (an edited-out page is not among them; a thumbnail is there as the thumbnail);
- `extra_fields`: the episode's usual facts for this row (`termination_reason` "context_edit" on
  every row but the last, `page_ids` and `turn_ids` of the row, ...), plus `episode_id`,
  `segment_index`, `context_length` and `sampled_mask` (every token the policy sampled, the
  context's too): what `vrag-rollout check` proves an episode's rows with (`segment_tensors`
  turns the per-row lists of a batch into its tensors).

Who takes a list (`refuse_unfit_trainer`, at loop init, before anything samples):
- verl's v1 worker `AgentLoopWorkerTQ` (`trainer.use_v1: true`, verl 0.9.1's default) stores each
  output as its own TransferQueue row, keyed `{uid}_{session_id}_{i}`, scores the last output
  (verl's reward managers read `data[-1:]`) and copies its reward to the earlier ones. Its
  `_compute_score` fails on rows of different lengths with mrope positions, so the rows need
  `v1_rows.GuardedRowsManager` (`agent_loop_manager_class`), whose worker scores the last row
  alone and runs the live guard. The legacy `AgentLoopWorker` (`trainer.use_v1: false`, the fully async trainer's
  rollouter, `GuardedAgentLoopManager`) takes one output per trajectory and is refused, as is
  verl's own v1 worker where it has reward-loop workers. The worker that will take the output is
  the one whose `_run_agent_loop` builds the loop (verl instantiates a loop per trajectory, inside
  that call): it is found on the call stack and decides; a loop built outside a worker falls back
  on `trainer.use_v1`.
- Advantages: `compute_advantage_for_multi_trajectories` (v1 `_compute_advantage`) runs GRPO on the
  last row of each `{uid}_{session_id}` and broadcasts its advantage to the session's rows, so an
  episode counts once whatever its rows. Every other estimator goes to verl's row-based
  `compute_advantage`, where an episode of k rows enters k times (its reward is on every row): refused.
- Loss: verl's `agg_loss` is row-based. Under `token-mean` and `token-sum` an episode's rows hold
  disjoint trained tokens (each row trains only its own turns), so every sampled token counts
  once, as in one row; the `seq-mean-*` modes weigh rows (an episode of k rows would weigh about
  k times one of one row): refused.
- KL: `algorithm.use_kl_in_reward` puts a penalty on every row's rewards, of which GRPO above reads
  the last row's only: refused (`use_kl_loss` keeps the KL term per token, in the loss).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Callable

import numpy as np
import torch

from ...core.batch import CONTEXT_EDIT, batch_rows, row_training_view

TQ_WORKER = ("verl.trainer.ppo.v1.agent_loop_tq", "AgentLoopWorkerTQ")  # verl 0.9.1's v1 worker
MANAGER_CLASS = "vrag_rollout.integrations.verl.v1_rows.GuardedRowsManager"  # the v1 trainer's manager
ROW_LOSS_MODES = ("token-mean", "token-sum")  # each sampled token counts once: rows need no weight
EPISODE_ESTIMATORS = ("grpo",)  # per session in compute_advantage_for_multi_trajectories
SEGMENT_FIELDS = ("episode_id", "segment_index", "context_length")
SAMPLED_MASK = "sampled_mask"
# verl 0.9.1's ppo_trainer.yaml defaults, for a trainer config that leaves them out
VERL_LOSS_AGG_MODE = "token-mean"
VERL_ADV_ESTIMATOR = "gae"
_POLICY = "context_keep_turns/context_keep_pages (a context policy) cut an episode into several training rows"


def calling_worker(limit: int = 64) -> Any:
    """The verl agent-loop worker whose `_run_agent_loop` is building the loop (verl instantiates
    each trajectory's loop there and hands `run`'s result to that worker's
    `_agent_loop_postprocess`); None outside one."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    frame = sys._getframe(1)
    for _ in range(limit):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, AgentLoopWorker):
            return candidate
        frame = frame.f_back
    return None


def takes_rows(worker: Any) -> bool:
    """Whether `worker`'s postprocessing takes a list of outputs per trajectory: verl's v1
    `AgentLoopWorkerTQ` or a subclass (a Ray actor's class derives from the one it wraps)."""
    return any((cls.__module__, cls.__qualname__) == TQ_WORKER for cls in type(worker).__mro__)


def scores_rows(worker: Any) -> bool:
    """Whether `worker` can score a list of rows: verl 0.9.1's `_compute_score` pads the rows' mrope
    positions together and fails on rows of different lengths (`v1_rows.py`), so a worker with
    reward-loop workers needs that method overridden (`v1_rows.SegmentRowsWorker`)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    own = inspect.unwrap(type(worker)._compute_score)  # past Ray's tracing wrapper of an actor's methods
    return getattr(worker, "reward_loop_worker_handles", None) is None or own is not AgentLoopWorker._compute_score


def _worker_name(worker: Any) -> str:
    for cls in type(worker).__mro__:  # past Ray's actor wrapper, whose own name says nothing
        if cls.__qualname__ != "_modify_class.<locals>.Class":
            return cls.__qualname__
    return type(worker).__qualname__


def _select(config: Any, path: str, default: Any) -> Any:
    node = config
    for key in path.split("."):
        if node is None:
            return default
        node = node.get(key) if hasattr(node, "get") else getattr(node, key, None)
    return default if node is None else node


def refuse_unfit_trainer(rollout_config: Any, trainer_config: Any, worker: Any) -> None:
    """Refuse a context policy (before any trajectory samples) where verl would not train an
    episode's rows as one episode: a worker that takes one output per trajectory, a loss mode that
    weighs rows, an advantage estimator that counts rows (module docstring). Nothing is refused
    without a context policy."""
    if not rollout_config.edits_context:
        return
    fix = (f"Run verl's v1 trainer with this project's rows worker: trainer.use_v1=True (verl 0.9.1's default) "
           f"and +actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER_CLASS} (the live guard's "
           "GuardedAgentLoopManager runs the legacy trainer only); or keep an episode in one row (drop "
           "context_keep_turns/context_keep_pages; search_page_max_pixels and visual_token_budget edit nothing); "
           "or train with `vrag-rollout learn`")
    if worker is not None and not takes_rows(worker) or worker is None and not _select(trainer_config,
                                                                                      "trainer.use_v1", False):
        where = f"this agent-loop worker ({_worker_name(worker)})" if worker is not None else "trainer.use_v1=False"
        raise ValueError(f"vrag_agent: {_POLICY}, one AgentLoopOutput each, and {where} takes exactly one output "
                         f"per trajectory (verl's legacy AgentLoopWorker). {fix}")
    if worker is not None and not scores_rows(worker):
        raise ValueError(
            f"vrag_agent: {_POLICY}, one AgentLoopOutput each, and this agent-loop worker ({_worker_name(worker)}) "
            "scores them with verl 0.9.1's AgentLoopWorker._compute_score, which pads the rows' mrope position ids "
            f"together and fails on rows of different lengths. {fix}")
    mode = str(_select(trainer_config, "actor_rollout_ref.actor.loss_agg_mode", VERL_LOSS_AGG_MODE))
    if mode not in ROW_LOSS_MODES:
        raise ValueError(
            f"vrag_agent: {_POLICY}, and actor_rollout_ref.actor.loss_agg_mode={mode} weighs each row as a "
            "sequence: an episode of k rows would weigh about k times an episode of one. Set "
            "actor_rollout_ref.actor.loss_agg_mode=token-mean (each sampled token counts once: an episode's rows "
            "train disjoint tokens), or drop the context policy")
    if _select(trainer_config, "algorithm.use_kl_in_reward", False):
        raise ValueError(
            f"vrag_agent: {_POLICY}, and algorithm.use_kl_in_reward=True puts a KL penalty in every row's reward, "
            "while GRPO here reads an episode's last row only: the earlier rows' penalty would be lost. Use "
            "actor_rollout_ref.actor.use_kl_loss=True for the KL term, or drop the context policy")
    estimator = _select(trainer_config, "algorithm.adv_estimator", VERL_ADV_ESTIMATOR)
    estimator = str(getattr(estimator, "value", estimator))  # verl's AdvantageEstimator enum, or its name
    if estimator not in EPISODE_ESTIMATORS:
        raise ValueError(
            f"vrag_agent: {_POLICY}, and algorithm.adv_estimator={estimator} is computed by verl per row "
            "(compute_advantage_for_multi_trajectories runs only GRPO per episode: on its last row, broadcast to "
            "the others), so an episode of k rows would enter its statistics k times. Set "
            "algorithm.adv_estimator=grpo, or drop the context policy")


def row_outputs(episode: Any, make_output: Callable[..., Any], extra: dict, with_logprobs: bool) -> list[Any]:
    """The episode's rows (`core.batch.batch_rows`: closed segments, then its current row) as
    outputs, in order. `make_output(part, response_mask, logprobs, images, entries, extra)` builds
    one output; `extra` holds the episode's fields, overridden per row here."""
    outputs = []
    for row in batch_rows([episode]):
        part, context = row.part, row.part.context_length
        loss, own_logprobs = row_training_view(part)  # the context was sampled under another context
        logprobs = own_logprobs if with_logprobs else None
        images = list(episode.prompt_images) + [page.image for page in part.images]
        entries = list(episode.prompt_images) + [page.entry for page in part.images]
        page_ids = [list(p) for p in part.page_ids]
        fields = {**extra,
                  "termination_reason": episode.termination if row.final else CONTEXT_EDIT,
                  "budget_overflow": episode.budget_overflow if row.final else None,
                  "page_ids": page_ids, "image_regions": list(part.image_regions),
                  "turn_ids": list(part.turn_ids), "multi_modal_data": {"images": entries},
                  "tool_extra_fields": {"page_ids": page_ids},
                  "episode_id": int(episode.index), "segment_index": row.segment_index,
                  "context_length": int(context), SAMPLED_MASK: list(part.loss_mask)}
        outputs.append(make_output(part, loss, logprobs, images, fields, row.final))
    return outputs


def ragged_tensor(rows: Any, width: int) -> torch.Tensor:
    """Per-row lists of ints as a `(B, width)` tensor, right-padded with 0 (as verl pads responses)."""
    out = torch.zeros((len(rows), width), dtype=torch.long)
    for row, values in enumerate(rows):
        out[row, : len(values)] = torch.as_tensor(list(values)[:width], dtype=torch.long)
    return out


def segment_tensors(batch: Any) -> bool:
    """A DataProto built from segment rows (verl's padded layout, the outputs' `extra_fields` as
    columns) made readable by `vrag-rollout check`: the `sampled_mask` column as a `(B, R)`
    tensor (0 on padding), `loss_mask` = `response_mask` (what verl's v1 worker stores), and the
    segment columns as integers. False (nothing changed) for a batch without segment rows."""
    columns = batch.non_tensor_batch
    column = columns.pop(SAMPLED_MASK, None)
    if column is None or any(row is None for row in column):
        return False
    batch.batch[SAMPLED_MASK] = ragged_tensor(column, batch.batch["responses"].shape[1])
    batch.batch["loss_mask"] = batch.batch["response_mask"].clone()
    for name in SEGMENT_FIELDS:
        columns[name] = np.array([int(value) for value in columns[name]], dtype=np.int64)
    return True


__all__ = ["EPISODE_ESTIMATORS", "MANAGER_CLASS", "ROW_LOSS_MODES", "SAMPLED_MASK", "calling_worker",
           "refuse_unfit_trainer", "row_outputs", "scores_rows", "segment_tensors", "takes_rows"]
