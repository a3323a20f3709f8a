"""Each benchmark's own answer scoring, one module per set, behind one interface. Pure.

`scorer_for(set_name)` gives the set's `Scorer` (`base`): `score(prediction, reference,
answer_format=None, answerable=True, *, question="")` per question and `aggregate(rows)` for
the set's headline numbers with counts, and `rules`, which rules those are. Set names are the
project's (`convert-dataset --from`), and `questions` for your own questions.

- `base`: the `Scorer` interface, shared counting, and the generic exact-match / token-F1 scorer (MMDocIR).
- `questions`: your own questions (converted without --from): the project's rules, exact match and
  token F1, and "Not answerable" marking an unanswerable question.
- `mmlongbench`: MMLongBench-Doc's per-format score (Int, Float, Str, List, None) and its accuracy and F1.
- `longdocurl`: LongDocURL's per-format score_v3 (Integer, Float, String, List, None) and its mean accuracy.
- `slidevqa`: SlideVQA's exact match and token F1 after its own normalization.
- `vidoseek`: ViDoSeek's rule-based scores, and the pinned judge prompt with its verdict parser.
"""

from __future__ import annotations

from . import longdocurl, mmlongbench, questions, slidevqa, vidoseek
from .base import GENERIC, Scorer

SCORERS: dict[str, Scorer] = {
    "vidoseek": vidoseek.SCORER,
    "slidevqa": slidevqa.SCORER,
    "mmlongbench-doc": mmlongbench.SCORER,
    "longdocurl": longdocurl.SCORER,
    "mmdocir": GENERIC,  # a retrieval benchmark: it publishes no answer scoring
    questions.NAME: questions.SCORER,  # your own questions (converted without --from)
}


def scorer_for(set_name: str) -> Scorer:
    if set_name not in SCORERS:
        raise ValueError(f"no scorer for set {set_name!r}; sets: {', '.join(SCORERS)}")
    return SCORERS[set_name]


__all__ = ["SCORERS", "Scorer", "scorer_for"]
