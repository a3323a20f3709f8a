"""verl 0.9.1's v1 agent-loop manager and worker with the live guard, fit for an episode's several
rows (`segments.py`).

Set `actor_rollout_ref.rollout.agent.agent_loop_manager_class=` `MANAGER_CLASS`
(`GuardedRowsManager`, a `+key` override) with `trainer.use_v1=True` (verl 0.9.1's default) to run
`vrag_agent` guarded, one row per trajectory or a context policy's rows.

**The worker** is verl's `AgentLoopWorkerTQ` (each output its own TransferQueue row, keyed
`{uid}_{session_id}_{i}`; the reward copied from the last row to the earlier ones) with two changes:
- the reward is computed on the last output alone (`SegmentRowsWorker`). verl's
  `AgentLoopWorker._compute_score` builds a batch of all of a trajectory's outputs and pads their
  position ids with `pad_sequence`, which fails on the Qwen VL families' `(4, L)` mrope positions as
  soon as two rows differ in length ("The size of tensor a (368) must match the size of tensor b
  (609) at non-singleton dimension 1"); every reward manager of verl 0.9.1 reads only that batch's
  last row (`data[-1:]`, as does the discriminative reward model's path), so scoring the last
  output alone gives the same reward;
- each training trajectory goes through the live guard (`verify/guard.py`) in
  `_agent_loop_postprocess`, before verl stores it (`GuardedRowsWorker`).

**What the guard sees is what verl stores.** verl's v1 postprocessing derives each output's
`multi_modal_inputs` (`_compute_multi_modal_inputs`) and `position_ids` (`_compute_position_ids`)
from the unpadded row (prompt + response, attention all ones) and puts them in TransferQueue
without handing them back. The worker derives them first, with the same calls on the same
arguments, and keeps them for the trajectory: verl's own calls (in the storing loop and in its
scoring of the last output) get those very objects back, so the guard's positions are the stored
ones, and the processor runs once per row as before. The guard reads the trajectory's rows laid
out as verl's legacy batch (`rows_view`: left-padded prompts, right-padded responses, the stored
positions at their tokens, `loss_mask` = `response_mask` as verl stores it, the loop's extra fields
as columns, `turn_ids` and a segment batch's `sampled_mask` as tensors): the checks of the legacy
path, per trajectory. Segment rows are one episode, so a bad row takes the episode's rows with it
(`guard._whole_episodes`). A trajectory is all the v1 worker ever holds: the GRPO check compares
no sessions (verl puts each one in TransferQueue as it finishes), and validation trajectories are
not guarded (nothing trains on them).

**The modes** (the `guard*` fields of the loop's `vrag` entry, read as the legacy path reads them:
`guard.guard_config`). A row whose processor inputs and positions verl's own derivation cannot
compute (its image pad runs and images disagree: verl would raise on storing it) is bad too
(`bad/derivation`).
- `fail`: `GuardFailure` from `_agent_loop_postprocess`: the session fails as any failing session
  does in verl's v1 worker (logged, its prompt's status in TransferQueue `failure`), and nothing of
  the trajectory is stored. What becomes of the prompt's group is the v1 replay buffer's rule: the
  sync trainer trains on its other sessions (or refills it under `sync_refill_failed_groups`), the
  async ones evict and refill it. Unlike the legacy trainer's, the step does not stop;
- `drop`: the trajectory is scored as the loop gave it (a dropped sample's reward stays in its GRPO
  group, as `guard.apply` keeps it; where verl cannot derive the last row, the emptied row is what
  it scores), then every row is emptied (`empty_outputs`): its prompt (without the prompt's images
  when their pad runs are broken: `emptying.empty_samples`' rule), one pad token of response with
  `response_mask` 0 and log-prob 0, no page, the rest of its extra fields kept. verl derives the
  emptied row's `multi_modal_inputs` and positions, which the guard proves safe for the forward
  pass (`Guard.forward_failures`, else `GuardFailure`), and stores it: a row like verl's own
  synthetic padding rows (`padding_utils`: one response token out of the mask), which adds no token
  to the loss or the entropy and gets advantage 0 from `compute_advantage_for_multi_trajectories`;
  its `rm_scores` is the trajectory's reward on that token. (A reward computed by the trainer, not
  by reward-loop workers, scores the emptied row.);
- `warn`: the verdict only (a row verl cannot derive still fails there, as without the guard);
  `off`: no guard is built and verl stores what the loop gave, with no `vrag_guard` field.
Bad samples are saved as the legacy path saves them (`guard_samples_dir`, by default
`guard_bad_samples/` under `trainer.default_local_dir`; `guard_samples_limit`): the trajectory's
rows as the guard read them, numbered by the worker's guarded trajectory (`step_NNNNN[.rankR].pt`,
R the worker's index), with `uid`, `session_id` and `global_steps` columns. Each trajectory's
`get_rope_index` comparison is drawn with probability `guard_positions_fraction` (every row is
compared with the mrope rule regardless).

**The verdict** goes in each row as its own TransferQueue field `vrag_guard` (the legacy path's
per-row counts): the outputs are handed to verl as `GuardedOutput`s, whose `as_dict` (what verl
stores) dumps it; `v1_metrics.py` turns the step's verdicts into its `guard/` metrics.

Importing this module imports TransferQueue (verl's v1).
"""

from __future__ import annotations

import contextvars
import logging
import random
from typing import Any, Optional

import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

from ...verify.check.report import Failure
from ...verify.guard import GuardFailure, LiveGuard, apply, row_verdicts
from .agent_loop import AGENT_NAME
from .guard import LiveGuardHolder
from .segments import MANAGER_CLASS
from .v1_metrics import GUARD_FIELD, install_v1_metrics
from .v1_view import Derived, empty_outputs, rows_view

logger = logging.getLogger(__name__)
_AGENT_NAME: contextvars.ContextVar = contextvars.ContextVar("vrag_v1_agent_name", default=None)

# verl decorates its v1 worker with @ray.remote: the class it wraps is the one to extend
_V1_WORKER = AgentLoopWorkerTQ.__ray_metadata__.modified_class.__ray_actor_class__


class GuardedOutput(AgentLoopOutput):
    """verl's output carrying the guard's verdict on its row, which verl's v1 worker stores as the
    row's own `vrag_guard` field (`as_dict` dumps every field that is set)."""

    vrag_guard: Optional[dict] = None


def guarded_output(output: AgentLoopOutput) -> GuardedOutput:
    """`output` (verl's `AgentLoopOutput`) as a `GuardedOutput`: its values, not copied; no verdict yet."""
    values = {name: getattr(output, name) for name in type(output).model_fields}
    return GuardedOutput.model_construct(_fields_set=set(output.model_fields_set), **values)


class SegmentRowsWorker(_V1_WORKER):
    """verl's v1 worker, scoring a trajectory's outputs by the last one alone (module docstring)."""

    async def _compute_score(self, outputs: list, kwargs: dict) -> None:
        await super()._compute_score(outputs[-1:], kwargs=kwargs)


class GuardedRowsWorker(LiveGuardHolder, SegmentRowsWorker):
    """`SegmentRowsWorker` whose training trajectories go through the live guard before verl
    stores them (module docstring)."""

    _warned_other = False

    def _built(self, live: LiveGuard) -> None:  # positions drawn per trajectory, not per call
        self._positions_fraction = float(live.guard.positions_fraction)
        self._positions_draw = random.Random(self.guard_rank)

    # ---- verl's derivation of a row, kept for the trajectory being postprocessed ----
    def _derived(self) -> dict:
        if "_derived_rows" not in self.__dict__:
            self._derived_rows: dict = {}  # id(output) or id(its multi_modal_inputs) -> Derived
        return self._derived_rows

    def _derive(self, output: Any, strict: bool = True) -> Derived:
        """What verl's v1 `_agent_loop_postprocess` computes for `output`, computed now with its
        calls and kept: verl's own calls get these objects back (`_compute_multi_modal_inputs`,
        `_compute_position_ids` below). Where verl's derivation raises (a row whose image pad runs
        and images disagree: the processor's grids do not fit its tokens), `strict` raises too;
        otherwise the error is returned for the guard to report, and nothing is kept."""
        kept = self._derived()
        old = kept.pop(id(output), None)
        if old is not None:
            kept.pop(id(old.multi_modal_inputs), None)
        input_ids = torch.cat([torch.tensor(output.prompt_ids, dtype=torch.int64),
                               torch.tensor(output.response_ids, dtype=torch.int64)], dim=0)
        attention_mask = torch.ones_like(input_ids, dtype=torch.int64)
        try:
            inputs = self._compute_multi_modal_inputs(output, input_ids)
            positions = self._compute_position_ids(input_ids.unsqueeze(0), attention_mask.unsqueeze(0), inputs)
        except Exception as error:
            if strict:
                raise
            return Derived(output, input_ids, None, None, error)
        row = Derived(output, input_ids, inputs, positions.squeeze(0))
        kept[id(output)] = kept[id(inputs)] = row
        return row

    def _forget(self, outputs: list) -> None:
        kept = self._derived()
        for output in outputs:
            row = kept.pop(id(output), None)
            if row is not None:
                kept.pop(id(row.multi_modal_inputs), None)

    def _compute_multi_modal_inputs(self, output: Any, input_ids: Any) -> Any:
        row = self._derived().get(id(output))
        if row is not None and row.output is output and torch.equal(row.input_ids, input_ids.reshape(-1)):
            return row.multi_modal_inputs
        return super()._compute_multi_modal_inputs(output, input_ids)

    def _compute_position_ids(self, input_ids: Any, attention_mask: Any, multi_modal_inputs: Any,
                              mm_processor_kwargs: Optional[dict] = None) -> Any:
        row = self._derived().get(id(multi_modal_inputs))
        if (row is not None and row.multi_modal_inputs is multi_modal_inputs and bool(attention_mask.all())
                and torch.equal(row.input_ids, input_ids.reshape(-1))):
            return row.position_ids.unsqueeze(0)
        return super()._compute_position_ids(input_ids, attention_mask, multi_modal_inputs, mm_processor_kwargs)

    # ---- the guard ----
    async def _run_agent_loop(self, sampling_params: dict, trajectory: dict, *, agent_name: str, **kwargs: Any) -> Any:
        token = _AGENT_NAME.set(agent_name)  # the loop's name, which verl does not pass to the postprocessing
        try:
            return await super()._run_agent_loop(sampling_params, trajectory, agent_name=agent_name, **kwargs)
        finally:
            _AGENT_NAME.reset(token)

    async def _agent_loop_postprocess(self, output: Any, validate: bool, **kwargs: Any) -> Any:
        outputs = output if isinstance(output, list) else [output]
        live = None if validate or not outputs else self.live_guard()
        if live is None or any(type(row) is not AgentLoopOutput for row in outputs):  # not verl's plain output:
            return await super()._agent_loop_postprocess(output, validate, **kwargs)  # no verdict to carry
        rows = [guarded_output(row) for row in outputs]
        try:
            if _AGENT_NAME.get() in (None, AGENT_NAME):
                await self.guard_rows(rows, kwargs, live)
            else:
                if not self._warned_other:
                    logger.warning("guard: trajectories of other agent loops (%s) are not guarded", _AGENT_NAME.get())
                    self._warned_other = True
                for row in rows:
                    row.vrag_guard = {}  # no count, but the field: the step's rows can be read for the others'
            return await super()._agent_loop_postprocess(rows if isinstance(output, list) else rows[0], validate,
                                                         **kwargs)
        finally:
            self._forget(rows)

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else 0)

    async def guard_rows(self, rows: list, kwargs: dict, live: LiveGuard) -> None:
        """Inspect a trajectory's rows (`GuardedOutput`s) as verl will store them and act (module
        docstring): each row's `vrag_guard` verdict set; `fail` raises `GuardFailure`; `drop`
        scores the trajectory, then empties its rows."""
        width = getattr(live.config, "response_length", None)
        derived = [self._derive(row, strict=False) for row in rows]
        view = rows_view(rows, derived, kwargs, self._pad_id(), width)
        fraction = self._positions_fraction
        live.guard.positions_fraction = fraction if fraction >= 1 or self._positions_draw.random() < fraction else 0.0
        report = live.last = live.guard.inspect(view, live.config)
        underived = [s for s, row in enumerate(derived) if row.error is not None]
        for s in underived:  # verl could not derive the row at all: bad, whatever else the checks found
            report.failures.setdefault(s, []).append(Failure(
                "derivation", s, None, f"verl's own derivation of the row's processor inputs and positions raised "
                f"({type(derived[s].error).__name__}: {derived[s].error}): verl would fail on it"))
        if underived and "episode_id" in view.non_tensor_batch:  # one episode: its rows go together
            for s in range(len(rows)):
                report.failures.setdefault(s, [Failure("segments", s, None,
                                                       f"another row of its episode ({underived[0]}) fails")])
        report.failures = dict(sorted(report.failures.items()))
        if live.samples is not None:
            live.samples.record(view, report)
        verdicts = row_verdicts(report, dropped=live.mode == "drop")
        if not report.ok:
            logger.warning("guard (%s): %s session %s: %d of %d rows bad, %s: %s", live.mode, kwargs.get("uid"),
                           kwargs.get("session_id"), len(report.failures), report.samples,
                           "emptied" if live.mode == "drop" else "kept", " | ".join(report.lines(3)))
        apply(view, report, live.mode)  # `fail` raises here
        if live.mode == "drop" and not report.ok:
            if derived[-1].error is None:  # verl scores the last row: as the policy produced it, where it can
                await self._compute_score(rows, kwargs=kwargs)
            empty_outputs(rows, view, live.guard, report.pixel_band, self._pad_id())
            emptied = rows_view(rows, [self._derive(row) for row in rows], kwargs, self._pad_id(), width)
            left = live.guard.forward_failures(emptied, list(range(len(rows))), live.config)
            if left:
                raise GuardFailure("guard: emptying a trajectory's rows left them unsafe for the trainer's forward "
                                   "pass: " + "; ".join(str(f) for f in left[:3]))
            for verdict in verdicts:  # the trajectory's every row (an episode's are all bad already)
                verdict["dropped"] = verdict["emptied"] = 1.0
        for row, verdict in zip(rows, verdicts):
            row.vrag_guard = verdict


class GuardedRowsManager(AgentLoopManagerTQ):
    """verl's v1 agent-loop manager spawning `GuardedRowsWorker`s, each told its index; installs
    the driver's metric hooks (`install_v1_metrics`)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        import ray

        self.agent_loop_workers_class = ray.remote(GuardedRowsWorker)  # the workers start in create()
        install_v1_metrics()

    async def _init_agent_loop_workers(self) -> None:
        import asyncio

        await super()._init_agent_loop_workers()
        await asyncio.gather(*[worker.set_guard_rank.remote(rank)
                               for rank, worker in enumerate(self.agent_loop_workers)])




__all__ = ["GUARD_FIELD", "GuardedOutput", "GuardedRowsManager", "GuardedRowsWorker", "MANAGER_CLASS",
           "SegmentRowsWorker", "guarded_output", "install_v1_metrics"]
