"""The live guard: the structural facts `check` proves, on a trainer batch in memory, cheaply.

Contract: `Guard(model_dir)` loads the model's own oracle once (`check/oracle.py`: its config,
processor, tokenizer and rope index; nothing of the rollout's code). `guard.inspect(batch)`
takes a trainer batch (DataProto-like: `batch`, `non_tensor_batch`, `meta_info`; it is read,
never changed) and returns a `GuardReport` with, per bad sample, the `Failure`s `check` reports,
minus the forward pass:
- shapes: a batch whose tensor widths are broken fails every sample;
- the row contract (`check/contract.py`): masks 0/1, a left-padded prompt, real response tokens
  contiguous, the loss mask inside the response mask, nothing after the first EOS and an EOS last
  where the sample says it ended on one; no padded vocabulary row sampled;
- vision tokens: well-formed blocks, none in the loss, one pad run per image of the sample's
  `multi_modal_data`, each as long as the image processor's own patch count for that image's
  size after the trainer's pixel rule (`get_number_of_image_patches`: no pixel is processed);
- observations: the loss mask against token roles, in the batch's action format
  (`check/observations.py`); turn ids against the loss mask (`check/turns.py`);
- the rollout's log-probs: finite and at most 0 on real response tokens;
- GRPO groups: one prompt per group (by uid or n-chunk), not identical (`check/groups.py`);
- a segmented batch's episodes (`check/segments.py`): rows in order, contexts out of the loss and
  holding the earlier rows' sampled tokens verbatim; a bad row takes its episode's rows with it;
- mrope positions of every sample against the still-image mrope rule (`check/mrope_rule.py`, a
  few tensor operations on the ids and the grids taken from the images' sizes), and of
  `positions_fraction` of the samples (at least one), drawn per call, against the family's own
  `get_rope_index` as well (the independent oracle, a hundred times the rule's cost).
What it cannot see is what only `check --forward` sees: log-probabilities (image features in the
wrong order at equal sizes, a wrong image at the right size).
`apply(batch, report, mode)` acts on the report: `fail`, `drop` (the default of the trainers'
`guard` setting), `warn` or `off`. `LiveGuard` is what a trainer holds (the guard, its mode, a
`BadSampleLog` of the run's first bad samples); `row_verdicts`/`column_metrics` carry each
sample's verdict through a trainer that splits and concatenates batches.
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import numpy as np
import torch

from .check.contract import check_log_probs, check_padded_rows, check_row_contract, check_shapes
from .check.groups import check_groups
from .check.images import rescaled_size, trainer_rescale, vision_blocks, vision_in_loss
from .check.oracle import ModelOracle, load_oracle
from .check.mrope_rule import rule_positions
from .check.positions import check_positions
from .check.report import Failure
from .check.rows import sample_rows
from .check.segments import check_segments, episodes_of
from .check.runner import observation_layout
from .check.turns import check_turns
from .emptying import empty_samples, rollout_positions
from .image_entries import entry_image
from .saved_batch import SHRINKING_KEYS, SavedBatch, _config_dict, _pixel_band

# The columns the checks read (the images are read in place, never encoded).
_COLUMNS = ("uid", "termination_reason", "doc_id", "episode_id", "segment_index", "context_length")


@dataclass
class GuardReport:
    samples: int
    failures: dict[int, list[Failure]] = field(default_factory=dict)  # sample -> its failures
    positions_checked: list[int] = field(default_factory=list)  # also compared with get_rope_index
    pixel_band: dict = field(default_factory=dict)  # the trainer's pixel rule the images were read under

    @property
    def bad_samples(self) -> list[int]:
        return sorted(self.failures)

    @property
    def ok(self) -> bool:
        return not self.failures

    def by_check(self) -> Counter:
        """Bad samples per check (a sample counts once per check it fails)."""
        return Counter(check for fails in self.failures.values() for check in {f.check for f in fails})

    def metrics(self, prefix: str = "guard/") -> dict[str, float]:
        out = {f"{prefix}checked": float(self.samples), f"{prefix}bad": float(len(self.failures)),
               f"{prefix}positions_checked": float(len(self.positions_checked))}
        out.update({f"{prefix}bad/{check}": float(count) for check, count in sorted(self.by_check().items())})
        return out

    def lines(self, limit: int = 5) -> list[str]:
        """The first failure of the first `limit` bad samples, one line each."""
        return [str(self.failures[s][0]) for s in self.bad_samples[:limit]]


class Guard:
    def __init__(self, model_dir: Any = None, *, oracle: Optional[ModelOracle] = None,
                 positions_fraction: float = 0.125, seed: int = 0):
        if not 0 <= positions_fraction <= 1:
            raise ValueError(f"positions_fraction must be in [0, 1], got {positions_fraction}")
        self.oracle = oracle or load_oracle(str(model_dir))
        self.positions_fraction = positions_fraction
        self._draw = random.Random(seed)
        self._merge = int(getattr(self.oracle.processor.image_processor, "merge_size", 2))

    def inspect(self, batch: Any, config: Any = None) -> GuardReport:
        images = _images(batch)
        view = _in_memory_view(batch, images, self.oracle.processor, config)
        report = GuardReport(samples=len(view), pixel_band=dict(view.pixel_band))
        fails, _ = check_shapes(view)
        if fails:  # nothing per sample can be read
            report.failures = {s: list(fails) for s in range(len(view))}
            return report
        oracle, t = self.oracle, view.tensors
        native, observations = observation_layout(view)
        turn_ids = t.get("turn_ids")
        rows = sample_rows(view)
        count = min(len(rows), max(1, round(self.positions_fraction * len(rows)))) if self.positions_fraction else 0
        report.positions_checked = sorted(self._draw.sample(range(len(rows)), count))
        compare_positions = set(report.positions_checked)
        log_probs = t.get("rollout_log_probs")
        found: dict[int, list[Failure]] = {}
        for row in rows:
            s = row.index
            fails = check_row_contract(row, t["prompts"][s].long(), oracle.eos_ids, native)
            fails += check_padded_rows(row, len(oracle.tokenizer))
            fails += check_log_probs(row, log_probs[s] if log_probs is not None else None)
            blocks, vision_fails = vision_blocks(row, oracle)
            fails += vision_fails + self._image_runs(row, blocks, images[s], view.pixel_band)
            fails += observations(row, oracle)
            fails += check_turns(row, turn_ids[s] if turn_ids is not None else None)
            if not fails:
                fails += self._positions(row, images[s], view.pixel_band, s in compare_positions)
            if fails:
                found[s] = fails
        group_fails, _ = check_groups(view)
        segment_fails, _ = check_segments(view)
        for failure in group_fails + segment_fails:
            found.setdefault(failure.sample, []).append(failure)
        report.failures = dict(sorted(_whole_episodes(view, found).items()))
        return report

    def forward_failures(self, batch: Any, rows: list[int], config: Any = None) -> list[Failure]:
        """What would break the trainer's forward pass in `rows` of `batch`: vision blocks, pad runs
        against the images, and positions against the family's own `get_rope_index`, whatever
        else those samples fail (a repaired sample fails the row contract by design)."""
        images = _images(batch)
        view = _in_memory_view(batch, images, self.oracle.processor, config)
        fails, _ = check_shapes(view)
        if fails:
            return fails
        by_index = {row.index: row for row in sample_rows(view)}
        for s in rows:
            row = by_index[s]
            blocks, vision_fails = vision_blocks(row, self.oracle)
            found = vision_fails + self._image_runs(row, blocks, images[s], view.pixel_band)
            fails += found or check_positions(row, self._grids(images[s], view.pixel_band), self.oracle)
        return fails

    def _positions(self, row: Any, images: list, band: Mapping, with_rope_index: bool) -> list[Failure]:
        """Every sample against the mrope rule (`check/mrope_rule.py`, vectorised); the drawn ones,
        and any the rule does not cover, against the family's own `get_rope_index` as well."""
        grids = self._grids(images, band)
        expected = rule_positions(row.ids, row.attention, grids, self.oracle.image_pad, self._merge)
        fails = [] if expected is None else check_positions(row, grids, self.oracle, expected, "the mrope rule")
        if with_rope_index or expected is None:
            fails = fails or check_positions(row, grids, self.oracle)
        return fails

    def _grids(self, images: list, band: Mapping) -> Optional[torch.Tensor]:
        """`image_grid_thw` of the sample's images as the trainer processes them, from their sizes
        alone: the trainer's pixel rule, then the image processor's own resize rule (`smart_resize`
        of its module, with its patch and merge sizes and pixel limits), checked against its own
        patch count. Running the processor on the pixels gives the same grids at a hundred times
        the cost; it is the fallback for a processor without that rule."""
        if not images:
            return None
        processor = self.oracle.processor.image_processor
        # a wrapper around the processor (e.g. one that caches its outputs) names it `__wrapped__`
        rule_of = getattr(processor, "__wrapped__", processor)
        resize = getattr(sys.modules.get(type(rule_of).__module__), "smart_resize", None)
        size = getattr(processor, "size", None)
        shortest, longest = (getattr(size, "shortest_edge", None), getattr(size, "longest_edge", None)) if size else (None, None)
        patch = getattr(processor, "patch_size", None)
        grids = []
        for image in images:
            width, height = rescaled_size(image.width, image.height, band.get("trainer_min_pixels"),
                                          band.get("trainer_max_pixels"))
            if resize is None or not (shortest and longest and patch):
                break
            rows, cols = resize(height, width, factor=patch * self._merge, min_pixels=shortest, max_pixels=longest)
            grid = (1, rows // patch, cols // patch)
            if grid[1] * grid[2] != processor.get_number_of_image_patches(height, width):
                break  # the processor's rule is not the one read here: ask the processor
            grids.append(grid)
        else:
            return torch.tensor(grids, dtype=torch.long)
        views = [trainer_rescale(image, band.get("trainer_min_pixels"), band.get("trainer_max_pixels"))
                 for image in images]
        return self.oracle.expand_images(views)[1]

    def image_run_length(self, image: Any, band: Mapping) -> int:
        """The pad run the image processor makes of `image` (PIL) under the trainer's pixel rule."""
        width, height = rescaled_size(image.width, image.height, band.get("trainer_min_pixels"),
                                      band.get("trainer_max_pixels"))
        count = self.oracle.processor.image_processor.get_number_of_image_patches(height, width)
        return count // (self._merge * self._merge)

    def _image_runs(self, row: Any, blocks: list[tuple[int, int]], images: list, band: Mapping) -> list[Failure]:
        """One pad run per image, each as long as the image processor's count for its size; no
        vision token in the loss."""
        s, fails = row.index, vision_in_loss(row, self.oracle)
        if len(blocks) != len(images):
            return fails + [Failure("image_tokens", s, blocks[0][0] if blocks else None,
                                    f"{len(blocks)} image pad runs but {len(images)} images")]
        for k, ((start, end), image) in enumerate(zip(blocks, images)):
            want = self.image_run_length(image, band)
            if end - start != want:
                fails.append(Failure("image_tokens", s, start, f"image {k}: pad run of {end - start} tokens at "
                                     f"[{start}, {end}), the processor expands this image to {want} "
                                     f"({image.width}x{image.height} px)"))
        return fails


def _in_memory_view(batch: Any, images: list[list], processor: Any, config: Any) -> SavedBatch:
    """The batch as the checks read it: its tensors (on the CPU, not copied when there already),
    the few columns they use, its config and pixel band. Its `images` are the PIL images, not
    encoded: the checks used here count them and never decode."""
    tensors = {key: value.detach().cpu() for key, value in batch.batch.items()}
    columns_in = batch.non_tensor_batch or {}
    columns = {name: list(columns_in[name]) for name in _COLUMNS if name in columns_in}
    meta = dict(batch.meta_info or {})
    config_dict = {key: value for key, value in _config_dict(config).items()
                   if key in ("action_format", "region_action", "n", "temperature", "page_min_pixels",
                              "page_max_pixels", "response_length", *SHRINKING_KEYS)}
    recorded = columns_in.get("rollout_meta")  # verl's agent loop keeps its settings per sample
    if recorded is not None and len(recorded) and isinstance(recorded[0], Mapping):
        for key in ("action_format", "region_action", "temperature"):
            if key in recorded[0]:
                config_dict.setdefault(key, recorded[0][key])
    return SavedBatch(tensors=tensors, images=images, columns=columns, config=config_dict, meta=meta,
                      pixel_band=_pixel_band(processor, config_dict, meta))


def _images(batch: Any) -> list[list]:
    """Per sample, its images as the trainer holds them (any entry kind, `image_entries`), as PIL,
    in sequence order."""
    column = (batch.non_tensor_batch or {}).get("multi_modal_data")
    if column is None:
        return [[] for _ in range(int(batch.batch["responses"].shape[0]))]
    rows = [list((item or {}).get("images", (item or {}).get("image")) or []) for item in column]
    decoded: dict = {}  # id -> (entry, image): a page shared by many samples is decoded once
    for row in rows:
        for entry in row:
            if id(entry) not in decoded:
                decoded[id(entry)] = (entry, entry_image(entry))
    return [[decoded[id(entry)][1] for entry in row] for row in rows]


# ---- what to do with bad samples ----
MODES = ("fail", "drop", "warn", "off")  # = config.GUARD_MODES (verify imports nothing of the rollout)
SAMPLES_AUTO = "auto"  # = config.GUARD_SAMPLES_AUTO: unresolved, no run output named, so none saved
_MASKS = ("response_mask", "loss_mask")  # EasyR1's loss reads response_mask; the rollout's batch has both
GUARD_COLUMN = "vrag_guard"  # per row: that sample's verdict (`row_verdicts`), for trainers that reduce per row


class GuardFailure(RuntimeError):
    """`fail` mode: the batch holds bad samples; the message names the first ones."""


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"guard must be one of {MODES}, got {mode!r}")
    return mode


def _whole_episodes(view: Any, found: dict[int, list[Failure]]) -> dict[int, list[Failure]]:
    """A segmented batch's bad row takes its episode's other rows with it: each holds part of the
    same episode, and a later row's context is an earlier row's turns."""
    episodes = episodes_of(view)
    if not episodes:
        return found
    out = dict(found)
    for rows in episodes.values():
        bad = [row for row in rows if row in found]
        for row in rows:
            if bad and row not in out:
                out[row] = [Failure("segments", row, None, f"another row of its episode ({bad[0]}) fails")]
    return out


def apply(batch: Any, report: GuardReport, mode: str) -> dict[str, float]:
    """Act on `report` as `mode` says; returns the step's `guard/` metrics.

    - `fail`: raise `GuardFailure` naming the bad samples (the step does not train on them);
    - `drop`: zero each bad sample's loss and response masks in place, so it adds no token to the
      loss. It stays in its GRPO group's reward mean and standard deviation: its reward is still
      an outcome the policy produced, and leaving it keeps the other samples' advantages exactly
      what they would be; only its own gradient (one sample's share of the group) is lost.
      `LiveGuard` also empties a sample whose image tokens are broken (`emptying.py`): the
      trainer's forward pass would raise for the whole batch on it;
    - `warn`: change nothing; the metrics and the caller's log say what was found;
    - `off`: the caller does not inspect at all (nothing to do here).
    """
    check_mode(mode)
    metrics = report.metrics()
    bad = report.bad_samples
    if not bad or mode in ("warn", "off"):
        return {**metrics, "guard/dropped": 0.0}
    if mode == "fail":
        raise GuardFailure(f"guard: {len(bad)} of {report.samples} samples fail the batch checks: "
                           + "; ".join(report.lines()))
    for name in _MASKS:
        if name in batch.batch.keys():
            batch.batch[name][bad] = 0
    by_check = {f"guard/dropped/{check}": float(count) for check, count in sorted(report.by_check().items())}
    return {**metrics, "guard/dropped": float(len(bad)), **by_check}


def row_verdicts(report: GuardReport, dropped: bool) -> np.ndarray:
    """Per sample, its verdict as numbers (`checked` 1, `bad` and `dropped` 0/1, `bad/<check>` and,
    when dropped, `dropped/<check>` 1 for each check it fails),
    an object column: a trainer that splits and concatenates the batch keeps each row's own, and
    `column_metrics` sums them back into the step's counts."""
    column = np.empty(report.samples, dtype=object)
    for s in range(report.samples):
        fails = report.failures.get(s)
        verdict = {"checked": 1.0, "bad": float(bool(fails)), "dropped": float(bool(fails) and dropped)}
        for check in sorted({f.check for f in fails or ()}):
            verdict[f"bad/{check}"] = 1.0
            if dropped:
                verdict[f"dropped/{check}"] = 1.0
        column[s] = verdict
    return column


def column_metrics(column: Any, prefix: str = "guard/") -> dict[str, float]:
    """The step's counts from a `GUARD_COLUMN` (sums over rows; a name missing from a row is 0)."""
    totals: Counter = Counter()
    for verdict in column:
        totals.update({name: float(value) for name, value in (verdict or {}).items()})
    return {f"{prefix}{name}": float(value) for name, value in sorted(totals.items())}


def batch_counts(batch: Any) -> dict[str, float]:
    """The step's `guard/` counts of a trainer batch from its `GUARD_COLUMN` ({} without one)."""
    column = (getattr(batch, "non_tensor_batch", None) or {}).get(GUARD_COLUMN)
    return column_metrics(column) if column is not None else {}


class BadSampleLog:
    """The first bad samples of a run, saved where `vrag-rollout view` opens them.

    `record` is called once per guarded batch; a batch that has bad samples, until `limit` samples
    are saved, has its bad rows written as they came out of the rollout (before `drop` zeroed their
    masks) to `directory/step_NNNNN.pt` (NNNNN: the batch's number among this log's batches, from 1)
    (`.rankR` before `.pt` on data-parallel rank R > 0), with columns `guard_failures` (each sample's
    failure lines, which `view` shows), `guard_step` and `guard_sample` (its row in that step's
    batch); `saved_batch.save_rollout` writes it, so `check` and `view` read it.
    """

    def __init__(self, directory: Any, limit: int = 16, *, rank: int = 0, processor: Any = None,
                 model_path: Any = None, config: Any = None):
        self.directory = Path(directory)
        self.limit, self.rank = int(limit), int(rank)
        self.processor, self.model_path, self.config = processor, model_path, config
        self.saved = 0
        self.steps = 0
        self.paths: list[Path] = []

    def record(self, batch: Any, report: GuardReport) -> Optional[Path]:
        self.steps += 1
        rows = report.bad_samples[: max(0, self.limit - self.saved)]
        if not rows:
            return None
        from .saved_batch import save_rollout

        part = _rows_of(batch, rows)
        failures = np.empty(len(rows), dtype=object)
        for k, s in enumerate(rows):
            failures[k] = [str(f) for f in report.failures[s]]
        part.non_tensor_batch["guard_failures"] = failures
        part.non_tensor_batch["guard_step"] = np.full(len(rows), self.steps, dtype=object)
        part.non_tensor_batch["guard_sample"] = np.array(rows, dtype=object)  # its row in the step's batch
        suffix = f".rank{self.rank}" if self.rank else ""
        path = self.directory / f"step_{self.steps:05d}{suffix}.pt"
        save_rollout(part, path, processor=self.processor, model_path=self.model_path, config=self.config)
        self.saved += len(rows)
        self.paths.append(path)
        return path


def _rows_of(batch: Any, rows: list[int]) -> Any:
    """Some rows of a DataProto-like batch, as a plain object `save_rollout` reads (no copy of the rest)."""
    from types import SimpleNamespace

    index = torch.tensor(rows, dtype=torch.long)
    tensors = {key: value.detach().cpu()[index] for key, value in batch.batch.items()}
    columns = {key: np.asarray(value, dtype=object)[rows] if not isinstance(value, np.ndarray) else value[rows]
               for key, value in (batch.non_tensor_batch or {}).items()}
    return SimpleNamespace(batch=tensors, non_tensor_batch=columns, meta_info=dict(batch.meta_info or {}))


# Failures the trainer's forward pass itself cannot get through: it scatters each image's features
# into its pad run and raises ("Image features and image tokens do not match") for the whole batch
# when a sample's pads and images disagree. A zeroed mask does not keep a sample out of that pass.
FORWARD_BREAKING = ("image_tokens",)


class LiveGuard:
    """What a trainer holds: a `Guard`, its mode and, optionally, its `BadSampleLog`.

    `live(batch)` inspects the batch, saves its first bad samples, acts on them (`apply`), writes
    each row's verdict to `GUARD_COLUMN` and returns the step's `guard/` metrics.
    """

    def __init__(self, guard: Guard, mode: str = "drop", samples: Optional[BadSampleLog] = None,
                 config: Any = None, rederive: Optional[Callable[[Any, list[int]], None]] = None):
        if check_mode(mode) == "off":
            raise ValueError("a LiveGuard in mode 'off' would inspect nothing: build none instead")
        self.guard, self.mode, self.samples, self.config = guard, mode, samples, config
        self.rederive = rederive  # the trainer's own re-derivation of an emptied row's columns
        self.last: Optional[GuardReport] = None

    @classmethod
    def from_config(cls, model_dir: Any, config: Any, *, rank: int = 0, processor: Any = None) -> Optional["LiveGuard"]:
        """From the rollout config's `guard*` fields (`config.AgentRolloutConfig`); None when `off`."""
        mode = check_mode(getattr(config, "guard", "drop"))
        if mode == "off":
            return None
        guard = Guard(model_dir, positions_fraction=getattr(config, "guard_positions_fraction", 0.125), seed=rank)
        directory = getattr(config, "guard_samples_dir", None)
        directory = None if directory == SAMPLES_AUTO else directory  # a trainer resolves "auto" to its run's output
        samples = (BadSampleLog(directory, getattr(config, "guard_samples_limit", 16), rank=rank,
                                processor=processor or guard.oracle.processor, model_path=model_dir, config=config)
                   if directory else None)
        return cls(guard, mode, samples, config)

    def __call__(self, batch: Any) -> dict[str, float]:
        report = self.last = self.guard.inspect(batch, self.config)
        if self.samples is not None:  # every batch, so its files are numbered by the guarded step
            self.samples.record(batch, report)
        batch.non_tensor_batch[GUARD_COLUMN] = row_verdicts(report, dropped=self.mode == "drop")
        metrics = apply(batch, report, self.mode)
        if self.mode == "drop":
            breaking = [s for s, fails in report.failures.items() if any(f.check in FORWARD_BREAKING for f in fails)]
            metrics["guard/emptied"] = float(len(breaking))
            if breaking:
                self._empty(batch, breaking, report)
            for s in breaking:
                batch.non_tensor_batch[GUARD_COLUMN][s]["emptied"] = 1.0
        return metrics

    def _empty(self, batch: Any, rows: list[int], report: GuardReport) -> None:
        """Empty `rows` (`emptying.empty_samples`), re-derive their columns, and prove the batch
        safe for the forward pass again: a repair that leaves a broken sample raises."""
        empty_samples(batch, rows, self.guard, report.pixel_band)
        if self.rederive is not None:
            self.rederive(batch, rows)
        else:
            rollout_positions(batch, rows, self.guard, report.pixel_band)
        left = self.guard.forward_failures(batch, rows, self.config)
        if left:
            raise GuardFailure(f"guard: emptying samples {rows} left them unsafe for the trainer's forward pass: "
                               + "; ".join(str(f) for f in left[:3]))


def guarded(rollout: Callable[[Any], Any], live: LiveGuard) -> Callable[[Any], Any]:
    """`rollout` whose every batch goes through `live`; the step's `guard/` metrics go to the
    batch's `meta_info["guard"]`."""

    def run(prompts: Any) -> Any:
        batch = rollout(prompts)
        batch.meta_info["guard"] = live(batch)
        return batch

    return run
