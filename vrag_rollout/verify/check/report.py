"""The checker's verdict: `Failure`, `Report` (human lines and one JSON line), `CheckInputError`.

Contract: a `Failure` names the check, the sample and the position (an index in the full
prompt+response row, P + response position), each None when the failure has none. A `Report` is
ok when it holds no failure; `Report.summary()` is the machine-readable verdict (the CLI's last
line, `Report.to_json()`), `Report.human()` the readable one ending in PASS or FAIL.
`CheckInputError` means the inputs cannot be checked at all: no report is made.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Optional


class CheckInputError(ValueError):
    """The inputs cannot be checked at all (not a batch, a model of another family, ...)."""


@dataclass(frozen=True)
class Failure:
    check: str
    sample: Optional[int]
    position: Optional[int]  # index in the full prompt+response row (P + response position)
    message: str

    def __str__(self) -> str:
        where = "" if self.sample is None else f"sample {self.sample}"
        if self.position is not None:
            where += f" position {self.position}"
        return f"[{self.check}] {where}: {self.message}" if where else f"[{self.check}] {self.message}"


@dataclass
class Report:
    path: str
    model_dir: str
    samples: int = 0
    model_family: Optional[str] = None
    failures: list[Failure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    forward: Optional[dict] = None

    @property
    def ok(self) -> bool:
        return not self.failures

    def by_check(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for failure in self.failures:
            counts[failure.check] = counts.get(failure.check, 0) + 1
        return counts

    def summary(self) -> dict:
        """The machine-readable verdict (the CLI's last line)."""
        return {
            "ok": self.ok,
            "file": self.path,
            "model": self.model_dir,
            "model_family": self.model_family,
            "samples": self.samples,
            "failures": len(self.failures),
            "by_check": self.by_check(),
            "first_failures": [asdict(f) for f in self.failures[:20]],
            "forward": self.forward,
            "notes": self.notes,
        }

    def to_json(self) -> str:
        return json.dumps(self.summary(), sort_keys=True)

    def human(self, limit: int = 50) -> str:
        lines = [f"check {self.path}: {self.samples} sample{'' if self.samples == 1 else 's'}, {self.model_family or '?'} model {self.model_dir}"]
        lines += [f"  {failure}" for failure in self.failures[:limit]]
        if len(self.failures) > limit:
            lines.append(f"  ... and {len(self.failures) - limit} more failures")
        lines += [f"  note: {note}" for note in self.notes]
        if self.forward is not None:
            f = self.forward
            lines.append(
                f"  forward: {f['tokens']} sampled tokens, logprob gap max {f['max_gap']:.3g} "
                f"(sample {f['max_gap_sample']} position {f['max_gap_position']}), mean {f['mean_gap']:.3g}"
                + (" [action grammar replayed: compared under it]" if f.get("grammar_replayed") else
                   " [action grammar active: constrained logprobs]" if f.get("grammar") else "")
            )
        verdict = "PASS" if self.ok else f"FAIL: {len(self.failures)} failures " + json.dumps(self.by_check())
        if self.ok and self.forward is not None and self.forward.get("grammar") and not self.forward.get(
                "grammar_replayed"):
            # the verdict itself says what was not proven, not only a note above it
            verdict += (" (logprobs not compared to the forward pass: an action grammar constrained the "
                        "sampling and the batch does not record it, so the rollout logprobs are the grammar's; save the "
                        "rollout with its config to compare)")
        lines.append(verdict)
        return "\n".join(lines)
