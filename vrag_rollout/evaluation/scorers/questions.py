"""Your own questions (`convert-dataset` without `--from`): the `questions` benchmark. Pure.

No paper defines how questions you wrote are scored, so these are the project's rules, not a
published set's: the answer parts of the project's training reward (`vrag_rollout.core.reward`),
simple enough to check by hand.

* `accuracy`: normalized exact match of the policy's `<answer>` against the reference answer;
* `f1`: token F1 over the same normalized words;
* the normalization (`core.reward.normalize_answer`): lower case, ASCII punctuation and the
  articles a/an/the dropped, whitespace collapsed. Nothing more: no number words, units or
  synonyms ("11%" against "eleven percent" scores 0);
* the benchmark's numbers: the means of both over the counted questions, with the counts
  (`base.mean_aggregate`); a question without an answer scores 0 on both and is counted in
  `unanswered`.

Unanswerable questions (`answerable`): a reference answer that normalizes to "Not answerable"
(MMLongBench-Doc's wording; "not answerable." too) marks the question unanswerable. With
`--unanswerable score` (the default) it counts, and its right answer is "Not answerable", scored
like any other reference; with `--unanswerable exclude` it is left out and counted apart.

Retrieval is scored as for every set (`evaluation.retrieval`): a question without gold pages (an
open-domain question converted with `--scope corpus`, or an unanswerable one) has no retrieval
metrics and is left out of the retrieval means, not scored 0.
"""

from __future__ import annotations

from vrag_rollout.core.reward import normalize_answer

from .base import GENERIC_RULES, Scorer, generic_score, mean_aggregate
from .mmlongbench import NOT_ANSWERABLE

NAME = "questions"  # the benchmark your own questions form in the report and the results header


def answerable(reference: str) -> bool:
    """False for a reference answer that says the question is unanswerable ("Not answerable",
    after the scoring's normalization)."""
    return normalize_answer(reference) != normalize_answer(NOT_ANSWERABLE)


SCORER = Scorer(NAME, generic_score, mean_aggregate,
                rules=f"the project's rules, not a published set's: {GENERIC_RULES}; a reference answer "
                      f"\"{NOT_ANSWERABLE}\" marks an unanswerable question (scored or left out: --unanswerable)")
