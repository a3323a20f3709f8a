"""The shape every benchmark scorer has, and the generic exact-match / token-F1 scorer. Pure.

A `Scorer` is two functions:

* `score(prediction, reference, answer_format=None, answerable=True, *, question="")` ->
  `dict[str, float]`, one question's metrics. `prediction` is the policy's final `<answer>`
  text, or None when the episode gave none (a turn-capped episode): it scores 0 on every metric
  and is counted in `unanswered` (a caller that wants to exclude such questions leaves their rows
  out of `aggregate`). `reference` is the set's answer (a list answer may be passed as a list).
  `answer_format` is the set's own format label where its scoring depends on it
  (MMLongBench-Doc, LongDocURL); `answerable` is false for a question the set marks
  unanswerable; `question` is the question text (SlideVQA's normalization reads it). Each scorer
  ignores the arguments its set's definition does not use.
  Every dict holds `accuracy` (the set's primary per-question score, in [0, 1]) and `answered`
  (1.0, or 0.0 for a None prediction); each set adds its own keys.
* `aggregate(per_question)` -> `dict[str, float]`, the set's headline numbers over the dicts
  `score` returned. Every aggregate holds `accuracy`, `count` (questions) and `unanswered`
  (None predictions among them), and `unsearched` where rows carry it; an empty list gives zeros.

Each `Scorer` also carries `rules`: one sentence saying which rules score its set and whose they
are (a set's published scoring, or the project's own), which the report prints with the set.

The generic scorer (`GENERIC`, used for MMDocIR, a page/layout RETRIEVAL benchmark that
publishes no answer scoring) gives `accuracy` = normalized exact match and `f1` = token F1,
both with `vrag_rollout.core.reward`'s SQuAD-style normalization (lower case, ASCII punctuation
and the articles a/an/the dropped, whitespace collapsed); its aggregate is their means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

from vrag_rollout.core.reward import exact_match, token_f1

Reference = Union[str, Sequence[str]]
Row = dict[str, float]


@dataclass(frozen=True)
class Scorer:
    """One set's answer scoring: `score` per question, `aggregate` over a set, `rules` in words
    (module docstring)."""

    name: str
    score: Callable[..., Row]
    aggregate: Callable[[list[Row]], Row]
    rules: str = ""


def counts(per_question: list[Row]) -> Row:
    """`count` and `unanswered` (rows whose prediction was None), every aggregate's counts, and
    `unsearched` (answers scored 0 for want of a search, `evaluation.search_rule`) where rows
    carry that flag."""
    out = {"count": float(len(per_question)),
           "unanswered": float(sum(1 for row in per_question if not row.get("answered", 1.0)))}
    if any("unsearched" in row for row in per_question):
        out["unsearched"] = float(sum(row.get("unsearched", 0.0) for row in per_question))
    return out


def mean(per_question: list[Row], key: str) -> float:
    return sum(row[key] for row in per_question) / len(per_question) if per_question else 0.0


def reference_text(reference: Reference) -> str:
    """A list reference as one text (its items joined by ", "), for scorers that read text only."""
    return reference if isinstance(reference, str) else ", ".join(str(item) for item in reference)


def generic_score(prediction: Optional[str], reference: Reference, answer_format: Optional[str] = None,
                  answerable: bool = True, *, question: str = "") -> Row:
    if prediction is None:
        return {"accuracy": 0.0, "f1": 0.0, "answered": 0.0}
    truth = reference_text(reference)
    return {"accuracy": exact_match(prediction, truth), "f1": token_f1(prediction, truth), "answered": 1.0}


def mean_aggregate(per_question: list[Row]) -> Row:
    """The mean of `accuracy` and `f1` over all rows, with the counts."""
    return {"accuracy": mean(per_question, "accuracy"), "f1": mean(per_question, "f1"), **counts(per_question)}


# the words the generic rules are described in (MMDocIR's and your own questions' scorers)
GENERIC_RULES = ("`accuracy` is normalized exact match and `f1` token F1 against the reference answer, both "
                 "after vrag_rollout.core.reward's normalization (lower case; ASCII punctuation and the articles "
                 "a, an, the dropped; whitespace collapsed)")
GENERIC = Scorer("generic", generic_score, mean_aggregate,
                 rules=f"the project's rules (MMDocIR publishes retrieval metrics only): {GENERIC_RULES}")
