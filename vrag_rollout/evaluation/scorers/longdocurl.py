"""LongDocURL's answer scoring ("score_v3"), rule for rule. Pure.

Source: github.com/dengc2023/LongDocURL, `utils/utils_score_v3.py` (`eval_score`,
`get_clean_string`; its ANLS, float comparison and exact-match patterns are MMLongBench-Doc's,
imported from `mmlongbench`), `eval/extract_concise_answer_from_vllm.py` (`extract_per_record`:
how a prediction reaches `eval_score`) and `utils/calculate_metrics.py` (`calculate_accuracy`:
the set's number). Re-implemented here, not copied.

As in MMLongBench-Doc, the paper has a model extract a concise answer from the response; here
the policy's final `<answer>` is that concise answer. The pipeline then reads it as `read_answer`
does: with `eval` (here for constant expressions only, `evaluation.constant_eval`, so model
output is never run): "3" becomes the integer 3, "3.0" the float 3.0, "2019-2020" the integer
-1, "1/2" the float 0.5, "['a', 'b']" a list, "{'a', 'b'}" a list, and "1,000" the tuple (1, 0);
anything else stays text. The record holding it is then written as JSON and read back before
`calculate_metrics.py` scores it, so the value scored is the JSON round trip's: a tuple becomes a
list ("1500, 8000" is the list [1500, 8000]), a dict's keys become text. A value JSON cannot
write (a complex number, bytes, `...`) leaves the published record unwritten, so that question
drops out of the published mean; here it scores 0 (`Unwritable`).

Cleaning (`clean`, `get_clean_string`): lower case, commas dropped, then in turn a trailing
"kg", "mm", "m", "meters", "acres", "minutes", "mile", "miles", "million", "thousand" or
"billion" removed the way the published code does it (`str.rstrip` of those CHARACTERS, so
"film" becomes "fil"), "(...)" groups, one surrounding quote, a leading "$" or "£" and a
trailing "%" dropped.

Per question (`score`, by `answer_format`; the score is `accuracy`):

* `Integer`: both cleaned and read by `int`; 1 if equal. The prediction is the read value's
  text, so "3.0" (the float 3.0) and "three" score 0 against 3, unlike MMLongBench-Doc. An
  unreadable reference stays its cleaned text and an unreadable prediction is "", as published
  (so they are equal only for a reference that cleans to nothing).
* `Float`: both cleaned and read as floats; MMLongBench-Doc's comparison (1 % relative
  tolerance or equal when rounded, against the reference, / 100 and x 100).
* `String` and `None`: both cleaned; exact equality when the reference needs it (URL, date,
  number, ...), else ANLS with threshold 0.5.
* `List`: the reference may be a list, or text starting with "[" read by `eval` (constant
  expressions only); any value but a list is one item (a tuple the JSON round trip left a tuple
  cannot occur; one read here from "[...], [...]" is one item); the prediction likewise; dict
  items become their values joined by "-". All items
  cleaned. If the first reference item is a number or needs exact match: 1 only if the items
  joined by "-" are equal, IN ORDER. Otherwise greedy ANLS: each reference item takes its best
  ANLS over the predicted items, the mean of those is scaled by sqrt(min(1, |reference| /
  |prediction|)) (extra predicted items cost; order does not matter).

An empty reference or predicted list scores 0 (the published code raises there). Any other
`answer_format` raises ValueError (the published code scores it as a list). Note that this
project's `convert-dataset` writes a list answer as its items joined by ", ": pass the set's
own list (or its "[...]" text) as `reference`, or it is read as one item.

The set (`aggregate`): `accuracy` = mean score over all questions (`calculate_accuracy`; a None
prediction scores 0, as "Fail to extract" does there). The script's "rectified" accuracy
rescales a partial run to 2,325 questions; here every question is scored, so it is not needed.
`answerable` is not used: the published scoring has no unanswerable rule (a "None" question is
scored as text).
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

from ..constant_eval import NotEvaluated, evaluate
from .base import Reference, Row, Scorer, counts, mean
from .mmlongbench import anls, float_equal, is_number, needs_exact_match

FORMATS = ("String", "Integer", "Float", "List", "None")
UNITS = ("kg", "mm", "m", "meters", "acres", "minutes", "mile", "miles", "million", "thousand", "billion")


class Unwritable(ValueError):
    """An answer whose value JSON cannot write: the published pipeline never scores it."""


def clean(value: Any) -> str:
    text = str(value).lower().strip().replace(",", "")
    for unit in UNITS:
        if text.endswith(unit):
            text = text.rstrip(unit).strip()  # strips characters, as published
    text = re.sub(r"\s*\([^)]*\)", "", text).strip()
    text = re.sub(r"^['\"]|['\"]$", "", text).strip()
    return text.lstrip("$").strip().lstrip("£").strip().rstrip("%").strip()


def _evaluated(text: str) -> Any:
    """`eval(text)` for a constant expression, else the text itself."""
    try:
        return evaluate(text)
    except NotEvaluated:
        return text


def read_answer(text: str) -> Any:
    """The prediction as `calculate_metrics.py` reads it back (module docstring): evaluated, a set
    as a list, through JSON. Raises `Unwritable` for a value JSON cannot write."""
    value = _evaluated(text)
    if isinstance(value, set):
        value = list(value)
    try:
        return json.loads(json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError) as error:
        raise Unwritable(f"JSON cannot write {type(value).__name__}: {error}") from None


def _as_list(value: Any) -> list:
    if isinstance(value, str) and value.startswith("["):
        value = _evaluated(value)  # unreadable: stays one text item
    items = value if isinstance(value, list) else [value]
    if items and isinstance(items[0], dict):
        items = ["-".join(map(str, item.values())) if isinstance(item, dict) else item for item in items]
    return items


def _as_int(value: Any, unreadable: Any) -> Any:
    text = clean(value)
    try:
        return int(text)
    except ValueError:
        return text if unreadable is None else unreadable


def _as_float(value: Any) -> Optional[float]:
    try:
        return float(clean(value))
    except ValueError:
        return None


def format_score(prediction: Any, reference: Reference, answer_format: str) -> float:
    """`eval_score` for one prediction (already read by `read_answer`)."""
    if answer_format == "Integer":
        # the published fallbacks: an unreadable reference stays its cleaned text, a prediction ""
        return float(_as_int(reference, None) == _as_int(prediction, ""))
    if answer_format == "Float":
        gold, guess = _as_float(reference), _as_float(prediction)
        return float(gold is not None and guess is not None and float_equal(gold, guess))
    if answer_format in ("String", "None"):
        gold, guess = clean(reference), clean(prediction)
        return float(gold == guess) if needs_exact_match(gold) else anls(gold, guess)
    if answer_format == "List":
        gold, guess = [clean(x) for x in _as_list(reference)], [clean(x) for x in _as_list(prediction)]
        if not gold or not guess:
            return 0.0
        if is_number(gold[0]) or needs_exact_match(gold[0]):
            return float("-".join(gold) == "-".join(guess))
        best = [max(anls(g, p) for p in guess) for g in gold]
        return sum(best) / len(gold) * min(1.0, len(gold) / len(guess)) ** 0.5
    raise ValueError(f"LongDocURL answer_format must be one of {', '.join(FORMATS)}, got {answer_format!r}")


def score(prediction: Optional[str], reference: Reference, answer_format: Optional[str] = None,
          answerable: bool = True, *, question: str = "") -> Row:
    if answer_format not in FORMATS:
        raise ValueError(f"LongDocURL answer_format must be one of {', '.join(FORMATS)}, got {answer_format!r}")
    if prediction is None:
        return {"accuracy": 0.0, "answered": 0.0}
    try:
        answer = read_answer(prediction.strip())
    except Unwritable:
        return {"accuracy": 0.0, "answered": 1.0}
    return {"accuracy": format_score(answer, reference, answer_format), "answered": 1.0}


def aggregate(per_question: list[Row]) -> Row:
    return {"accuracy": mean(per_question, "accuracy"), **counts(per_question)}


SCORER = Scorer("longdocurl", score, aggregate,
                rules="LongDocURL's published scoring (utils/utils_score_v3.py): a score per answer format, "
                      "`accuracy` its mean; the `<answer>` is scored without the paper's answer extraction")
