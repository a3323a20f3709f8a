"""MMLongBench-Doc's answer scoring, rule for rule. Pure.

Source: github.com/mayubo2333/MMLongBench-Doc, `eval/eval_score.py` (`eval_score`,
`get_clean_string`, `is_exact_match`, `is_float_equal`, `anls_compute`, `eval_acc_and_f1`) and
`run_api.py` / `run_lvlm.py` (how a prediction reaches `eval_score`). Re-implemented here, not
copied.

The paper's pipeline first has GPT-4o EXTRACT a short answer from the model's free-form
response (`eval/prompt_for_answer_extraction.md`), then compares it by rule. Here the policy's
final `<answer>` IS the extracted answer: no extraction model runs, so a verbose answer is
compared as written.

Per question (`score`, by the question's `answer_format`; the score is `accuracy`):

* `Int`: the reference read by `int`, the prediction by `int(float(...))` (so "3.0" and "3.7"
  both read as 3, truncated; "three" and "1,000" do not read and score 0); 1 if equal.
* `Float`: both cleaned (`clean`: "%" and a leading "$" dropped) and read as floats; 1 if the
  prediction matches the reference, the reference / 100 or the reference x 100 either within
  a relative tolerance of 1 % (`math.isclose(rel_tol=0.01)`) or when both round equal at
  max(2, fewer decimals of the two) decimals; else 0.
* `Str` and `None` (unanswerable, reference "Not answerable"): both cleaned (lower case,
  "(...)" groups, one surrounding quote, a leading "$" and a trailing "%" dropped); exact
  equality when the reference looks like a URL, file name, "page ...", phone number, a.m./p.m.
  time, date or e-mail (`needs_exact_match`); otherwise ANLS: 1 - Levenshtein / longer length,
  the lengths of the UPPER-CASED strings (so "ßab" is 4 long), set to 0 at or below 0.5 (so
  "Not answerable." still scores 14/15).
* `List`: a text starting with "[" is read as the script's `eval` reads it, here for constant
  expressions only (`evaluation.constant_eval`: "[2019-2020, 1/2]" is [-1, 0.5]; unreadable: 0,
  the run scripts' failure score); any value but a list is ONE item (a tuple too, so
  "['a'], ['b']" is one item). Lengths differ: 0. Otherwise both lists are cleaned and SORTED
  (order does not matter); if the first reference item is a number or needs exact match, 1 only
  if all items are equal, else the lowest item-wise ANLS. Only list answers are read this way:
  "1/2" as a `Float` answer does not read as a number, as published.

Any other `answer_format` raises ValueError (the published code silently scores it as a list).

The set (`aggregate`), as `eval_acc_and_f1`:

* `accuracy` = mean score over all questions;
* `recall` = summed score of the answerable questions / their number;
* `precision` = the same sum / the number of predictions other than exactly "Not answerable"
  (so a wrong "Not answerable" on an answerable question costs recall, and any answer to an
  unanswerable question costs precision);
* `f1` = 2PR / (P + R); 0 when either is undefined or both are 0.

A question is unanswerable when `answerable` is false or its reference is "Not answerable" (the
script tests the reference). A None prediction scores 0 and counts as a prediction other than
"Not answerable", as the scripts' "Failed to extract" does.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional

from ..constant_eval import NotEvaluated, evaluate
from .base import Reference, Row, Scorer, counts, mean

NOT_ANSWERABLE = "Not answerable"
FORMATS = ("Int", "Float", "Str", "List", "None")


# ---- the published helpers (LongDocURL's scoring reuses them)

def levenshtein(a: str, b: str) -> int:
    previous = list(range(len(a) + 1))
    for j, char_b in enumerate(b, 1):
        current = [j]
        for i, char_a in enumerate(a, 1):
            current.append(min(previous[i] + 1, current[i - 1] + 1, previous[i - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def anls(reference: str, prediction: str, threshold: float = 0.5) -> float:
    """1 - edit distance / the longer length, 0 at or below `threshold`; two empty strings score 1.
    The lengths are the upper-cased strings' ("ß" counts 2, as "SS"), as published."""
    length = max(len(reference.upper()), len(prediction.upper()))
    value = 1.0 - (levenshtein(reference, prediction) / length if length else 0.0)
    return 0.0 if value <= threshold else value


EXACT_PATTERNS = [re.compile(p) for p in (
    r"\b\d+(-\d+|\s\d+)?\b",               # a number, a phone number
    r"\b\d{4}[-\s]\d{2}[-\s]\d{2}\b",      # YYYY-MM-DD
    r"\b\d{4}[-\s]\d{2}\b",                # YYYY-MM
    r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}",  # e-mail
)]


def needs_exact_match(text: str) -> bool:
    """A cleaned reference that an edit-distance score would be wrong for (`is_exact_match`)."""
    return ("https://" in text or text.endswith((".py", "ipynb")) or text.startswith("page")
            or "a.m." in text or "p.m." in text or any(p.fullmatch(text) for p in EXACT_PATTERNS))


def is_number(text: str) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def _decimals(value: float) -> int:
    text = str(value)
    return len(text.split(".")[-1]) if "." in text else 3


def float_equal(reference: float, prediction: float) -> bool:
    """`is_float_equal(include_percentage=True, is_close=True)`: the reference as written, as a
    percentage (/ 100) or as a fraction (x 100), within 1 % or equal when rounded."""
    for item in (reference / 100, reference, reference * 100):
        if math.isclose(item, prediction, rel_tol=0.01):
            return True
        digits = max(min(_decimals(prediction), _decimals(item)), 2)
        if round(prediction, digits) == round(item, digits):
            return True
    return False


def clean(value: Any) -> str:
    """`get_clean_string`. Its unit lines ("mile", "miles", "million") discard their result in
    the published code, so no unit is removed here either."""
    text = str(value).lower().strip()
    text = re.sub(r"\s*\([^)]*\)", "", text).strip()
    text = re.sub(r"^['\"]|['\"]$", "", text).strip()
    return text.lstrip("$").strip().rstrip("%").strip()


def as_list(value: Any) -> list:
    """A list as the scripts read one: a text starting with "[" read as `eval` reads it (constant
    expressions only, `constant_eval`; ValueError when unreadable), then any value but a list as
    a one-item list (a tuple too: "['a'], ['b']" is one item)."""
    if isinstance(value, str) and value.startswith("["):
        try:
            value = evaluate(value)
        except NotEvaluated:
            raise ValueError(f"not a readable list: {value[:80]!r}") from None
    return value if isinstance(value, list) else [value]


# ---- one question

_FORMAT_ERROR = f"MMLongBench-Doc answer_format must be one of {', '.join(FORMATS)}, got {{!r}}"


def format_score(prediction: str, reference: Reference, answer_format: str) -> float:
    """`eval_score` for one prediction (already stripped) against the reference."""
    if answer_format == "Int":
        try:
            return float(int(reference) == int(float(prediction)))
        except (TypeError, ValueError, OverflowError):
            return float(reference == "")  # published: the prediction becomes "", the reference stays
    if answer_format == "Float":
        try:
            return float(float_equal(float(clean(reference)), float(clean(prediction))))
        except ValueError:
            return 0.0
    if answer_format in ("Str", "None"):
        gold, guess = clean(reference), clean(prediction)
        return float(gold == guess) if needs_exact_match(gold) else anls(gold, guess)
    if answer_format == "List":
        try:
            gold, guess = as_list(reference), as_list(prediction)
        except ValueError:
            return 0.0
        if len(gold) != len(guess) or not gold:
            return 0.0
        gold, guess = sorted(map(clean, gold)), sorted(map(clean, guess))
        if is_number(gold[0]) or needs_exact_match(gold[0]):
            return float("-".join(gold) == "-".join(guess))
        return min(anls(g, p) for g, p in zip(gold, guess))
    raise ValueError(_FORMAT_ERROR.format(answer_format))


def score(prediction: Optional[str], reference: Reference, answer_format: Optional[str] = None,
          answerable: bool = True, *, question: str = "") -> Row:
    """`accuracy` (the score), `answered`, and the two flags `aggregate` counts by."""
    if answer_format not in FORMATS:
        raise ValueError(_FORMAT_ERROR.format(answer_format))
    gold_answerable = answerable and reference != NOT_ANSWERABLE
    if prediction is None:
        return {"accuracy": 0.0, "answered": 0.0, "gold_answerable": float(gold_answerable), "pred_answerable": 1.0}
    prediction = prediction.strip()  # the run scripts strip the extracted answer
    return {"accuracy": format_score(prediction, reference, answer_format), "answered": 1.0,
            "gold_answerable": float(gold_answerable), "pred_answerable": float(prediction != NOT_ANSWERABLE)}


# ---- the set

def aggregate(per_question: list[Row]) -> Row:
    """Accuracy and `eval_acc_and_f1`'s F1 (module docstring), with precision, recall and counts."""
    answerable = [row for row in per_question if row["gold_answerable"]]
    predicted = sum(row["pred_answerable"] for row in per_question)
    hits = sum(row["accuracy"] for row in answerable)
    recall = hits / len(answerable) if answerable else 0.0
    precision = hits / predicted if predicted else 0.0
    f1 = 2 * recall * precision / (recall + precision) if answerable and predicted and recall + precision else 0.0
    return {"accuracy": mean(per_question, "accuracy"), "f1": f1, "precision": precision, "recall": recall,
            "answerable": float(len(answerable)), "predicted_answerable": float(predicted), **counts(per_question)}


SCORER = Scorer("mmlongbench-doc", score, aggregate,
                rules="MMLongBench-Doc's published scoring (eval/eval_score.py): a score per answer format, "
                      "`accuracy` its mean and `f1` of answer precision and recall; the `<answer>` is scored "
                      "without the paper's answer extraction")
