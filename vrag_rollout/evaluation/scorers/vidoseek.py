"""ViDoSeek answer scoring: rule-based scores beside a model judge's prompt and verdict parser. Pure.

How the papers score it: VRAG-RL (github.com/Alibaba-NLP/VRAG, `VRAG-RL/verl/workers/
reward_manager/rm.py`: `DEFAULT_SYSTEM_TEMPLATE`, `parse_judge_response`, `RMManager`) asks a
model (qwen-max) whether the generated answer is correct given the query and the reference
answer, and only for an episode that searched (`evaluation.search_rule`); ViDoSeek publishes no
rule-based metric. The judge itself runs elsewhere (the caller, through vLLM); this module gives
its pure parts:

* `JUDGE_PROMPT`: VRAG-RL's template's criteria, inputs and reply format, in this project's own
  words (the project copies no other project's text; what the judge is asked and how it must
  reply are the same), versioned by `JUDGE_PROMPT_VERSION` (change the version whenever the text
  changes, so numbers from two prompts are never mixed);
* `judge_request(question, reference, answer)`: the template filled as VRAG-RL fills it
  (`str.replace` of `{query}`, then `{reference_answer}`, then `{generated_answer}`);
* `read_judge_verdict(text)`: `parse_judge_response`: the first `<judge>...</judge>` block,
  True when it holds "true" or "True", else False when it holds "false" or "False", None
  otherwise (no block, "TRUE", "maybe"). One addition: reasoning in `<think>` blocks is dropped
  first, so a thinking judge's quoted instruction is not read as its verdict. VRAG-RL asks its
  API judge again after an unreadable reply; a greedy local judge would answer the same, so
  here it counts as wrong and is counted (`judge_unreadable`);
* `with_verdict(row, verdict)`: a `score` row with the verdict added (`judge`: 1.0 only for
  True; `judge_unreadable`: 1.0 for None). Ask the judge only for a real answer that searched:
  give the others' rows `with_verdict(row, False)`, as VRAG-RL scores them 0 unasked.

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

JUDGE_PROMPT_VERSION = "vrag-rl-criteria-1"
# VRAG-RL's judge criteria and reply format (`DEFAULT_SYSTEM_TEMPLATE` of VRAG-RL/verl/workers/
# reward_manager/rm.py) in this project's own words: the same inputs in the same order, the same
# question (is the generated answer correct, given the query and the reference?), the same
# allowance (it may say more than the reference) and the same reply (`<judge>True or False</judge>`).
JUDGE_PROMPT = """You are an expert grader of a question answering system.

You receive three things: the query, the generated answer and the reference answer. Decide
whether the generated answer is correct.

## Query
{query}

## Reference Answer
{reference_answer}

## Generated Answer
{generated_answer}

Reply in this format:
<judge>True or False</judge>

Write True inside the judge tags if the generated answer is correct, and False otherwise.

The generated answer may hold more information than the reference answer; that alone does not make it wrong.
"""

ARTICLES = re.compile(r"\b(a|an|the)\b")
THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
JUDGE_BLOCK = re.compile(r"<judge>(.*?)</judge>", re.DOTALL)


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
    """The judge's prompt for one question, filled in VRAG-RL's order (braces in the values stay)."""
    return (JUDGE_PROMPT.replace("{query}", question).replace("{reference_answer}", reference)
            .replace("{generated_answer}", answer))


def read_judge_verdict(text: Optional[str]) -> Optional[bool]:
    """VRAG-RL's `parse_judge_response` (module docstring), after dropping `<think>` reasoning."""
    if not text:
        return None
    text = THINK_BLOCK.sub(" ", text).rsplit("</think>", 1)[-1]  # a template may open <think> itself
    match = JUDGE_BLOCK.search(text)
    if match is None:
        return None
    block = match.group(0)  # the tags included, as published
    if "true" in block or "True" in block:
        return True
    if "false" in block or "False" in block:
        return False
    return None


def with_verdict(row: Row, verdict: Optional[bool]) -> Row:
    return {**row, "judge": float(verdict is True), "judge_unreadable": float(verdict is None)}


def aggregate(per_question: list[Row]) -> Row:
    out = {key: mean(per_question, key) for key in ("accuracy", "f1", "contains")}
    judged = [row for row in per_question if "judge" in row]
    if judged:
        out.update(judge_accuracy=mean(judged, "judge"), judge_count=float(len(judged)),
                   judge_unreadable=float(sum(row["judge_unreadable"] for row in judged)))
    return {**out, **counts(per_question)}


SCORER = Scorer("vidoseek", score, aggregate,
                rules="ViDoSeek as VRAG-RL scores it: with --judge, a local judge's verdict on VRAG-RL's criteria "
                      "(`judge_accuracy`); beside it the project's rule-based `accuracy` (normalized exact match), "
                      "`f1` (token F1) and `contains`, as VRAG-RL publishes no rule-based metric")
