"""Coverage: whether a gold page ever entered an episode's context, and when (pure).

Contract: `coverage(retrieval)` reads a record's retrieval metrics (`evaluation.retrieval`:
`recall_cumulative`, the share of gold pages shown by each turn) and returns

- `gold_shown`: whether any gold page was shown at all (coverage);
- `first_turn`: the turn (counted from 1) whose observation first showed a gold page, None when
  none was;

or None for a question without gold pages (an unanswerable or open-domain one): such a question
is neither covered nor missed. `split(records)` divides records into those whose episode was
shown a gold page (`gold shown`) and those never shown one (`never shown`), leaving out records
without gold pages; the report scores each part with the set's own rules, so a retrieval
failure (never shown) reads apart from a reading failure (shown, answered wrong).
"""

from __future__ import annotations

from typing import Optional, Sequence

SHOWN, NEVER = "gold shown", "never shown"


def coverage(retrieval: Optional[dict]) -> Optional[dict]:
    if not retrieval:
        return None
    cumulative = retrieval.get("recall_cumulative")
    if cumulative is None:  # a record of an older run: the final recall alone
        return {"gold_shown": retrieval["recall"] > 0, "first_turn": None}
    first = next((turn for turn, share in enumerate(cumulative, start=1) if share > 0), None)
    return {"gold_shown": first is not None, "first_turn": first}


def split(records: Sequence[dict]) -> dict[str, list[dict]]:
    """{SHOWN: records shown a gold page, NEVER: records with gold pages never shown one}."""
    parts: dict[str, list[dict]] = {SHOWN: [], NEVER: []}
    for record in records:
        found = record.get("coverage", coverage(record.get("retrieval")))
        if found is not None:
            parts[SHOWN if found["gold_shown"] else NEVER].append(record)
    return parts
