"""Named protocols: the settings a paper evaluates under, by one name (pure).

Contract: `named(name, overrides)` returns the `Protocol` of `name` with `overrides` (switch ->
value, only the switches given explicitly) applied on top, recording the name and, per override
that changes a value, the named protocol's own value (`Protocol.overrides`), so a report says
"vrag-rl, with max_turns 3 instead of 4". `NAMED[name]` holds each protocol's switches and
`ABOUT[name]` what it is and where each setting comes from; the report prints both.

- `vrag-rl`: VRAG-RL's evaluation (arXiv 2505.22019; github.com/Alibaba-NLP/VRAG): every question
  searches one merged corpus (all converted sets indexed together: `convert-dataset --merge`),
  4 turns (its training script's `max_turns=4`), an answer given without a search scores 0 on
  every set (`search_required`: its reward manager scores the format check first), and ViDoSeek
  judged by a model with its criteria (`--judge DIR`, prompt `vrag-rl-criteria-1`).
- `document`: the long-document sets' own setting (MMLongBench-Doc, LongDocURL, MMDocIR): each
  question searches its own document, 4 turns, the answer scored alone (no search rule).
- `own`: the project's defaults: each row's scope as converted, 4 turns, VRAG-RL's search rule
  for ViDoSeek only (each set as published).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from .protocol import Protocol

NAMED: dict[str, dict] = {
    "vrag-rl": {"scope": "corpus", "max_turns": 4, "search_required": True},
    "document": {"scope": "document", "max_turns": 4, "search_required": False},
    "own": {},
}

ABOUT = {
    "vrag-rl": ("VRAG-RL's (arXiv 2505.22019, github.com/Alibaba-NLP/VRAG): one merged corpus of every converted "
                "set searched by every question, 4 turns (its training script's max_turns=4), an answer without "
                "a search scores 0 on every set, ViDoSeek judged by a model with its criteria (--judge)"),
    "document": ("the long-document sets' (MMLongBench-Doc, LongDocURL, MMDocIR): each question searches its own "
                 "document, 4 turns, the answer scored alone"),
    "own": ("the project's defaults: each row's scope as converted, 4 turns, VRAG-RL's search rule for ViDoSeek "
            "only (each set as published)"),
}

JUDGED = {"vrag-rl"}  # the protocols whose numbers include a model judge's verdicts


def named(name: str, overrides: Optional[dict] = None) -> Protocol:
    """The named protocol with `overrides` applied and recorded (module docstring)."""
    if name not in NAMED:
        raise ValueError(f"protocol must be one of {', '.join(NAMED)}, got {name!r}")
    base = Protocol(**NAMED[name])
    given = {key: value for key, value in (overrides or {}).items() if key not in ("name", "overrides")}
    changed = {key: getattr(base, key) for key, value in given.items() if getattr(base, key) != value}
    return replace(base, **given, name=name, overrides=changed or None)
