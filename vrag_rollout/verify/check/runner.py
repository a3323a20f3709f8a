"""The entry points: every check in order on one batch, and the CLI body.

Contract: `check_batch(saved, model_dir, forward=False)` refuses (`CheckInputError`) a batch
recorded for another model family or holding token ids beyond the model's vocabulary; runs the
batch-wide shape checks and, only when those pass, per sample the contract, image-token,
position (skipped, with a note, where the image tokens are broken) and observation checks
(native tool-call or text format, per the config's `action_format`); then the GRPO check and,
with `forward`, the forward check. Failures come sorted by sample, then position.
`run_check(path, model_dir, ...)` loads the file first (a file that is not a batch is a
`CheckInputError`). `main(...)` prints the human report, then one JSON line, and returns 0 on
pass, 1 on failures, 2 on unusable input (the JSON line then holds `error`).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Optional

from ..saved_batch import NotABatchError, SavedBatch, load_rollout
from .contract import check_log_probs, check_padded_rows, check_row_contract, check_shapes
from .forward import check_forward
from .groups import check_groups
from .images import check_images
from .observations import check_native_observations, check_observations
from .turns import check_turns
from .oracle import load_oracle
from .positions import check_positions
from .report import CheckInputError, Report
from .rows import sample_rows
from .segments import check_segments


def _same_family(recorded: str, model_type: str) -> bool:
    """The batch's recorded family (a model_type or the rollout's name, e.g. "qwen2.5-vl") is the model's."""
    recorded = recorded.replace(".", "_").replace("-", "_")
    return recorded == model_type or model_type.startswith(recorded + "_")  # qwen3_vl covers qwen3_vl_moe


# Each action format's turn layout as this checker knows it (an independent oracle imports nothing
# of the rollout's formats): (turns end with the chat template's end of turn, the observation check).
LAYOUTS = {"tags": (False, check_observations), "tool_call": (True, check_native_observations)}


def observation_layout(saved: SavedBatch) -> tuple[bool, Any]:
    """(native turns, a row's observation check) of the batch's action format (tags when unrecorded)."""
    config = saved.config or {}
    action_format = config.get("action_format") or "tags"
    if action_format not in LAYOUTS:
        raise CheckInputError(f"the batch's action_format {action_format!r} is none this checker knows "
                              f"({', '.join(LAYOUTS)})")
    native, check = LAYOUTS[action_format]
    if native:
        return native, check
    return native, functools.partial(check, regions=bool(config.get("region_action")))


def check_batch(saved: SavedBatch, model_dir: str | Path, *, forward: bool = False, forward_tolerance: float = 1e-3,
                path: str = "<batch>") -> Report:
    """Every check on a loaded batch; CheckInputError when it cannot be checked at all."""
    oracle = load_oracle(str(model_dir))
    if saved.model_family and not _same_family(saved.model_family, oracle.family):
        raise CheckInputError(
            f"the batch was made by a {saved.model_family} model but --model {model_dir} is {oracle.family}: "
            f"pass that model, or for a tiny model's batch `vrag-rollout build-tiny-model --family "
            f"{str(saved.model_family).replace('_', '-').replace('2-5', '2.5')}` builds it"
        )
    report = Report(path=str(path), model_dir=str(model_dir), samples=len(saved), model_family=oracle.family)
    fails, notes = check_shapes(saved)
    report.failures += fails
    report.notes += notes
    if fails:
        report.notes.append("per-sample checks skipped: the batch's shapes are broken")
        return report
    width = oracle.logits_width  # the embedding's rows: the tokenizer's size, padded in released checkpoints
    if int(saved.tensors["input_ids"].max()) >= width:
        raise CheckInputError(f"the batch holds token ids up to {int(saved.tensors['input_ids'].max())}, beyond the "
                              f"{width} embedding rows of --model {model_dir}: another model?")
    prompts = saved.tensors["prompts"]
    rows = sample_rows(saved)
    processed: dict[int, Any] = {}
    skipped_positions = []
    native, observations = observation_layout(saved)
    turn_ids = saved.tensors.get("turn_ids")
    for row in rows:
        report.failures += check_row_contract(row, prompts[row.index].long(), oracle.eos_ids, native)
        report.failures += check_padded_rows(row, len(oracle.tokenizer))
        log_probs = saved.tensors.get("rollout_log_probs")
        report.failures += check_log_probs(row, log_probs[row.index] if log_probs is not None else None)
        image_fails, grids, outputs = check_images(row, saved, oracle)
        report.failures += image_fails
        processed[row.index] = outputs
        # The rope index reads one grid per pad run: with a stray vision token it cannot run.
        if not image_fails and (grids is not None or not saved.images[row.index]):
            report.failures += check_positions(row, grids, oracle)
        else:
            skipped_positions.append(row.index)
        report.failures += observations(row, oracle)
        report.failures += check_turns(row, turn_ids[row.index] if turn_ids is not None else None)
    if skipped_positions:
        report.notes.append(f"mrope positions not compared for samples {skipped_positions}: "
                            "their image tokens are broken")
    fails, notes = check_groups(saved)
    report.failures += fails
    report.notes += notes
    fails, notes = check_segments(saved)
    report.failures += fails
    report.notes += notes
    if forward:
        fails, stats, notes = check_forward(saved, oracle, rows, processed, forward_tolerance)
        report.failures += fails
        report.notes += notes
        report.forward = stats
    report.failures.sort(key=lambda f: (f.sample if f.sample is not None else -1, f.position or 0))
    return report


def run_check(path: str | Path, model_dir: Optional[str | Path] = None, forward: bool = False,
              forward_tolerance: float = 1e-3) -> Report:
    """Load `path` (a saved batch or a pickled trainer DataProto) and check it against `model_dir`
    (default: the model directory the batch records)."""
    try:
        saved = load_rollout(path)
    except NotABatchError as e:
        raise CheckInputError(str(e)) from e
    if model_dir is None:
        recorded = saved.model_path
        if not recorded or not (Path(recorded) / "config.json").is_file():
            raise CheckInputError(
                f"{path} records no model directory that exists here ({recorded or 'none'}): pass --model DIR"
                + (f" (a {saved.model_family} model; `vrag-rollout build-tiny-model --family ...` builds a tiny one)"
                   if saved.model_family else ""))
        model_dir = recorded
    return check_batch(saved, model_dir, forward=forward, forward_tolerance=forward_tolerance, path=str(path))


def main(path: str, model_dir: Optional[str] = None, forward: bool = False, forward_tolerance: float = 1e-3) -> int:
    """CLI body: the human report, then one JSON line; 0 pass, 1 failures, 2 unusable input."""
    try:
        report = run_check(path, model_dir, forward=forward, forward_tolerance=forward_tolerance)
    except (CheckInputError, FileNotFoundError) as e:
        print(f"error: {e}")
        print(json.dumps({"ok": False, "file": str(path), "model": str(model_dir), "error": str(e)}, sort_keys=True))
        return 2
    print(report.human())
    print(report.to_json())
    return 0 if report.ok else 1
