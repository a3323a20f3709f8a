"""SlideVQA's answer scoring: exact match and token F1 after its own normalization. Pure.

Source: github.com/nttmdlab-nlp/SlideVQA, `evaluate.py` (`normalize_answer`,
`evaluate_f1_em_qa`, `WORD_NUMBER_MAP`). Re-implemented here, not copied. Only the QA metrics;
the script's evidence-selection and joint metrics score retrieved pages, not answers.

Normalization (`normalize`), of answer and reference alike, in the published order:

1. lower case;
2. text replacements, in turn: "this is " and "it is " removed, "&" and "and" become ",",
   "percent" removed, "organisation" -> "organization", "because of", "because" and "due to"
   removed, "hours" -> "hrs", "minites" -> "min" (plain substring replacement, so "and" inside
   "brand" goes too, on both sides alike);
3. the unit the question asks about removed: the word after "how many" and the word after
   "which" in the question (case-sensitive, so a question starting "How many" removes none);
   nothing when no word follows (the published code raises there);
4. ASCII punctuation (`string.punctuation`) removed (a curly quote stays);
5. the articles a/an/the removed;
6. an answer starting with "yes" or "no" cut to its first word (so "north america" becomes
   "north": a published quirk, kept);
7. whitespace collapsed; the words zero ... nineteen written as digits ("three" -> "3").

Per question (`score`): the normalized texts split into tokens; with no token in common both
metrics are 0 (even two empty answers); else `f1` = 2PR / (P + R) over the common tokens and
exact match = 1 if the token lists are equal. `accuracy` is that exact match.
The set (`aggregate`): `accuracy` (SlideVQA's EM) and `f1`, each the mean over all questions.
SlideVQA has no unanswerable questions: `answerable` and `answer_format` are not used.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Optional

from .base import Reference, Row, Scorer, counts, mean, reference_text

NUMBER_WORDS = {word: str(n) for n, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen".split())}
REPLACEMENTS = (("this is ", ""), ("it is ", ""), ("&", ","), ("and", ","), ("percent", ""),
                ("organisation", "organization"), ("because of", ""), ("because", ""), ("due to", ""),
                ("hours", "hrs"), ("minites", "min"))  # "minites": the published spelling
UNIT_CUES = ("how many", "which")
PUNCTUATION = set(string.punctuation)
ARTICLES = re.compile(r"\b(a|an|the)\b")


def _drop_unit(text: str, question: str) -> str:
    for cue in UNIT_CUES:
        at = question.find(cue)
        following = question[at + len(cue):].split() if at >= 0 else []
        if following:
            text = text.replace(following[0], "")
    return text


def normalize(text: str, question: str = "") -> str:
    text = text.lower()
    for old, new in REPLACEMENTS:
        text = text.replace(old, new)
    text = _drop_unit(text, question)
    text = "".join(ch for ch in text if ch not in PUNCTUATION)
    text = ARTICLES.sub(" ", text)
    if text[:3] == "yes" or text[:2] == "no":
        text = text.split()[0]
    return " ".join(NUMBER_WORDS.get(word, word) for word in text.split())


def score(prediction: Optional[str], reference: Reference, answer_format: Optional[str] = None,
          answerable: bool = True, *, question: str = "") -> Row:
    if prediction is None:
        return {"accuracy": 0.0, "f1": 0.0, "answered": 0.0}
    guess = normalize(prediction, question).split()
    gold = normalize(reference_text(reference), question).split()
    common = sum((Counter(guess) & Counter(gold)).values())
    if common == 0:
        return {"accuracy": 0.0, "f1": 0.0, "answered": 1.0}
    precision, recall = common / len(guess), common / len(gold)
    return {"accuracy": float(guess == gold), "f1": 2 * precision * recall / (precision + recall), "answered": 1.0}


def aggregate(per_question: list[Row]) -> Row:
    """`evaluate_f1_em_qa`'s EM (as `accuracy`) and F1: means over all questions."""
    return {"accuracy": mean(per_question, "accuracy"), "f1": mean(per_question, "f1"), **counts(per_question)}


SCORER = Scorer("slidevqa", score, aggregate,
                rules="SlideVQA's published scoring (evaluate.py): exact match (`accuracy`) and token F1 (`f1`) "
                      "after its normalization")
