"""ViDoSeek answer scoring: rule-based scores beside a model judge's pinned prompt and parser. Pure.

How the papers score it: VRAG-RL (github.com/Alibaba-NLP/VRAG, `VRAG-RL/verl/workers/
reward_manager/rm.py`, `DEFAULT_SYSTEM_TEMPLATE` and `parse_judge_response`) asks a model
(qwen-max) whether the generated answer is correct given the query and the reference answer,
noting that the answer may carry more than the reference; ViDoSeek publishes no rule-based
metric. The judge itself runs elsewhere (the caller, through vLLM); this module gives its pure
parts, with a prompt written here (`JUDGE_PROMPT`, versioned by `JUDGE_PROMPT_VERSION`: change
the version whenever the text changes, so numbers from two prompts are never mixed):

* `judge_request(question, reference, answer)`: the prompt filled in;
* `read_judge_verdict(text)`: True / False from the judge's reply, None when unreadable;
* `with_verdict(row, verdict)`: a `score` row with the verdict added (`judge`: 1.0 only for
  True; `judge_unreadable`: 1.0 for None, which therefore counts as wrong). Ask the judge only
  for a real answer: give a None prediction's row `with_verdict(row, False)`.

Rule-based scores (`score`), after one normalization (`normalize`): Unicode NFKC, case folded,
Unicode punctuation removed (not only ASCII: ViDoSeek's documents and answers carry curly
quotes and dashes), a dash as a space so that "2019–2020" stays two words, the articles a/an/the removed, whitespace collapsed.

* `accuracy`: normalized exact match, the strict score;
* `f1`: token F1 (SQuAD's), partial credit for partial overlap;
* `contains`: 1 when the reference's tokens appear, contiguous and in order, in the answer's,
  the rule-based stand-in for the judge, which is told that an answer may add information
  beyond the reference (it misses paraphrases the judge accepts, and accepts an answer that
  lists the reference among wrong ones). An empty reference contains nothing.

The set (`aggregate`): the means of `accuracy`, `f1` and `contains` over all questions, and,
where rows carry verdicts, `judge_accuracy` (mean of `judge` over those rows) with
`judge_count` and `judge_unreadable`. ViDoSeek has no unanswerable questions: `answerable` and
`answer_format` are not used.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from typing import Optional

from .base import Reference, Row, Scorer, counts, mean, reference_text

JUDGE_PROMPT_VERSION = "vidoseek-judge-1"
JUDGE_PROMPT = """You are grading an answer to a question about a collection of documents.

Question: {question}
Reference answer: {reference}
Answer to grade: {answer}

The answer is correct if it gives the same fact as the reference answer: the same entity, value \
or yes/no, however it is worded, and it may add details that do not contradict the reference. \
Numbers must agree in value; their formatting and units may differ. The answer is incorrect if \
it contradicts or misses the reference, gives a different value, hedges between several \
answers, or says the question cannot be answered.

Reply with one word: true if the answer is correct, false if it is not."""

ARTICLES = re.compile(r"\b(a|an|the)\b")
THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
WORD = re.compile(r"[^\W\d_]+")  # a run of letters
VERDICTS = {"true": True, "false": False}


def _unpunctuated(ch: str) -> str:
    category = unicodedata.category(ch)
    if category == "Pd":
        return " "  # a dash parts words
    return "" if category.startswith("P") else ch


def normalize(text: str) -> str:
    text = "".join(map(_unpunctuated, unicodedata.normalize("NFKC", text).casefold()))
    return " ".join(ARTICLES.sub(" ", text).split())


def _contains(tokens: list[str], part: list[str]) -> bool:
    return bool(part) and any(tokens[i:i + len(part)] == part for i in range(len(tokens) - len(part) + 1))


def score(prediction: Optional[str], reference: Reference, answer_format: Optional[str] = None,
          answerable: bool = True, *, question: str = "") -> Row:
    if prediction is None:
        return {"accuracy": 0.0, "f1": 0.0, "contains": 0.0, "answered": 0.0}
    guess, gold = normalize(prediction).split(), normalize(reference_text(reference)).split()
    common = sum((Counter(guess) & Counter(gold)).values())
    f1 = 2 * common / (len(guess) + len(gold)) if common else float(guess == gold)
    return {"accuracy": float(guess == gold), "f1": f1, "contains": float(_contains(guess, gold)), "answered": 1.0}


def judge_request(question: str, reference: str, answer: str) -> str:
    """The judge's prompt for one question (`str.format` leaves braces inside the values as they are)."""
    return JUDGE_PROMPT.format(question=question.strip(), reference=reference.strip(), answer=answer.strip())


def read_judge_verdict(text: Optional[str]) -> Optional[bool]:
    """The verdict: the first word of the reply (after any `<think>` reasoning), true or false in
    any case and markup ("**True.**"); None for anything else ("Not true", an empty reply) and
    for a reply that names both ("true or false?")."""
    if not text:
        return None
    text = THINK_BLOCK.sub(" ", text)
    text = text.rsplit("</think>", 1)[-1]  # a template that opened <think> itself leaves only the close
    words = WORD.findall(text.casefold())
    if not words or words[0] not in VERDICTS or {"true", "false"} <= set(words):
        return None  # no verdict first, or both verdicts named: a hedge
    return VERDICTS[words[0]]


def with_verdict(row: Row, verdict: Optional[bool]) -> Row:
    return {**row, "judge": float(verdict is True), "judge_unreadable": float(verdict is None)}


def aggregate(per_question: list[Row]) -> Row:
    out = {key: mean(per_question, key) for key in ("accuracy", "f1", "contains")}
    judged = [row for row in per_question if "judge" in row]
    if judged:
        out.update(judge_accuracy=mean(judged, "judge"), judge_count=float(len(judged)),
                   judge_unreadable=float(sum(row["judge_unreadable"] for row in judged)))
    return {**out, **counts(per_question)}


SCORER = Scorer("vidoseek", score, aggregate)
