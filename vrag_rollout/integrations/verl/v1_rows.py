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

**The verdict** goes in each row as its own TransferQueue field `vrag_guard` (`GUARD_COLUMN`: the
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

Importing this module imports TransferQueue (verl's v1).
"""

from __future__ import annotations

import contextvars
import logging
import random
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

from ...verify.check.report import Failure
from ...verify.emptying import PAGE_COLUMNS, empty_samples
from ...verify.guard import GUARD_COLUMN, GuardFailure, LiveGuard, apply, row_verdicts
from .agent_loop import AGENT_NAME
from .guard import LiveGuardHolder, attach_turn_ids
from .segments import MANAGER_CLASS, SAMPLED_MASK, segment_tensors

logger = logging.getLogger(__name__)
GUARD_FIELD = GUARD_COLUMN  # each stored row's verdict (a TransferQueue field)
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


@dataclass
class Derived:
    """verl's v1 derivation of one output's row: what its `_agent_loop_postprocess` stores."""

    output: Any
    input_ids: torch.Tensor  # (L,) prompt + response
    multi_modal_inputs: Any
    position_ids: Optional[torch.Tensor]  # (4, L) mrope, or (L,); None where verl's derivation raised
    error: Optional[BaseException] = None  # what it raised (the row's tokens and images disagree)


def _object_column(values: list) -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):  # not column[:] = values: equal-length lists would broadcast
        column[i] = value
    return column


def rows_view(outputs: list, derived: list[Derived], kwargs: dict, pad_id: int,
              response_length: Optional[int] = None) -> Any:
    """A trajectory's rows as the guard reads a batch (verl's legacy padded layout: responses
    `response_length` wide, or as wide as the longest, which the guard reports), made of what verl's
    v1 worker stores: each row's tokens, masks and log-probs, its derived `position_ids` at its
    tokens, `loss_mask` = `response_mask`; the outputs' extra fields as columns (`turn_ids` and
    `sampled_mask` as tensors), and the trajectory's `uid`, `session_id`, `global_steps`."""
    from verl.protocol import DataProto

    size = len(outputs)
    P = max(len(output.prompt_ids) for output in outputs)
    R = max([len(output.response_ids) for output in outputs] + [int(response_length or 0)])
    prompts = torch.full((size, P), pad_id, dtype=torch.long)
    responses = torch.full((size, R), pad_id, dtype=torch.long)
    attention = torch.zeros((size, P + R), dtype=torch.long)
    response_mask = torch.zeros((size, R), dtype=torch.long)
    with_logprobs = all(output.response_logprobs is not None for output in outputs)
    logprobs = torch.zeros((size, R), dtype=torch.float32) if with_logprobs else None
    # 1 on padding, as verl's legacy `_compute_position_ids` leaves it (transformers' rope index too)
    lead = next((row.position_ids.shape[:-1] for row in derived if row.position_ids is not None), (4,))
    positions = torch.ones((size, *lead, P + R), dtype=torch.long)
    for s, (output, row) in enumerate(zip(outputs, derived)):
        p, r = len(output.prompt_ids), len(output.response_ids)
        prompts[s, P - p:] = row.input_ids[:p]
        responses[s, :r] = row.input_ids[p:]
        attention[s, P - p:P + r] = 1
        response_mask[s, :r] = torch.as_tensor(output.response_mask, dtype=torch.long)
        if logprobs is not None:
            logprobs[s, :r] = torch.as_tensor(output.response_logprobs, dtype=torch.float32)
        if row.position_ids is not None:
            positions[s, ..., P - p:P] = row.position_ids[..., :p]
            positions[s, ..., P:P + r] = row.position_ids[..., p:]
    tensors = {"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
               "attention_mask": attention, "response_mask": response_mask, "loss_mask": response_mask.clone(),
               "position_ids": positions}
    if logprobs is not None:
        tensors["rollout_log_probs"] = logprobs
    names = list(dict.fromkeys(name for output in outputs for name in output.extra_fields))
    columns = {name: _object_column([output.extra_fields.get(name) for output in outputs]) for name in names}
    for name in ("uid", "session_id", "global_steps"):
        columns[name] = _object_column([kwargs.get(name)] * size)
    batch = DataProto.from_dict(tensors=tensors)
    batch.non_tensor_batch.update(columns)
    attach_turn_ids(batch)
    segment_tensors(batch)  # segment rows: `sampled_mask` as a tensor, the segment columns as integers
    return batch


def empty_outputs(outputs: list, view: Any, guard: Any, band: dict, pad_id: int) -> None:
    """Empty every row of a dropped trajectory in place, as `emptying.empty_samples` empties the
    rows of `view` (the rows as the guard read them): the prompt as it leaves it (its images kept
    when their pad runs match them), one pad token of response out of the loss (verl's v1 row needs
    a token: its reward goes on the last one), log-prob 0, no page, no turn; each row's
    `extra_fields` a new dict (the loop's is left as it was)."""
    empty_samples(view, list(range(len(outputs))), guard, band)
    columns, width = view.non_tensor_batch, int(view.batch["prompts"].shape[1])
    media = columns.get("multi_modal_data")
    for s, output in enumerate(outputs):
        attended = view.batch["attention_mask"][s, :width].bool()
        kept = list(((media[s] if media is not None else None) or {}).get("images") or [])
        images = list((output.multi_modal_data or {}).get("images") or [])[:len(kept)]
        extra = dict(output.extra_fields)
        for name in ("multi_modal_data", "tool_extra_fields", *PAGE_COLUMNS):
            if name in extra and name in columns:
                extra[name] = columns[name][s]
        for name, value in (("image_regions", []), ("turn_ids", [0]), (SAMPLED_MASK, [0]), ("context_length", 0)):
            if name in extra:
                extra[name] = value
        output.prompt_ids = view.batch["prompts"][s][attended].tolist()
        output.response_ids, output.response_mask = [pad_id], [0]
        if output.response_logprobs is not None:
            output.response_logprobs = [0.0]
        output.multi_modal_data = {"images": images} if images else None  # as the loop hands verl a row
        output.extra_fields = extra


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




# ---- the driver's side: the rows' verdicts into the step's metrics ----
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


__all__ = ["GUARD_FIELD", "GuardedOutput", "GuardedRowsManager", "GuardedRowsWorker", "MANAGER_CLASS",
           "SegmentRowsWorker", "empty_outputs", "guard_counts", "guarded_output",
           "install_v1_metrics", "rows_view", "verdict_columns"]
