"""The reward of one VRAG episode: answer correctness, action format, retrieval quality. Pure.

Contract (what `examples/reward_function/vrag.py` hands EasyR1's `AutoRewardManager`):

* Input: the decoded *whole* response (sampled text and observations: `<result>…</result>` in the
  tags format, `<tool_response>…</tool_response>` in the tool_call format) and the ground truth. The ground truth is the dataset's answer column, either a plain answer string
  or a JSON object (what `vrag-rollout convert-dataset` writes)::

      {"answer": "...", "doc_id": "report", "gold_pages": [3, 5]}

  or, for a question over the whole corpus (`convert-dataset --scope corpus`), no document and
  each gold page as a (document, page) pair::

      {"answer": "...", "doc_id": null, "gold_pages": [["report", 3], ["deck_7", 12]]}

  to which the integration's reward-manager patch adds, per sample, the page ids the episode was
  shown (the rollout's `page_ids` column, one list per observation, ids `<doc>_<page>`)::

      {..., "page_ids": [["report_2", "report_3"], ["report_5"]]}

* Output: a dict of floats, EasyR1's `RewardScore` shape plus extra parts, each logged by EasyR1
  as `reward/<name>` (training) and `val/<name>_reward` (validation):
  - `accuracy`: normalized exact match of the last `<answer>` against the ground truth (1 or 0);
  - `f1`: token F1 of that answer (SQuAD-style normalization: lower case, no punctuation, no
    articles `a an the`, single spaces);
  - `format`: 1 when the policy's text (observations removed) has exactly one
    `<answer>…</answer>`, after every action, with every `<search>` non-empty, every `<fetch>`
    of the form `image|text, N` (N >= 1), every region action readable (`<crop>N, [x1, y1, x2,
    y2]</crop>`, `<bbox>[x1, y1, x2, y2]</bbox>`), every `<tool_call>` one the rollout can execute
    (`tool_turns.parse_tool_calls`), and no unclosed or stray tag (a leading `</think>` closes
    the `<think>` a thinking template's generation prompt opened); else 0 (numbers are read as
    the rollout reads them, `core.readers`: a page or coordinate it could not use scores 0, and
    no response, however hostile, makes the reward raise);
  - `retrieval`: NDCG of the distinct pages the episode was shown, in the order first shown,
    against the gold pages (binary relevance, DCG = sum rel_i / log2(i + 1), ideal DCG over all
    gold pages, so missing a gold page costs); 0 without gold pages or without pages shown. A
    page counts as (document, page): a page number of another document is not gold (gold page
    numbers without any document named match the number in whatever document was shown);
  - `overall` = sum of weight x part over `accuracy`, `f1`, `format`, `retrieval`.

`turn_retrieval_scores(turn_page_ids, ground_truth)` is a per-turn signal beside it: each turn's
NDCG of the pages it newly showed (from the rollout's `turn_page_ids` column), for turn-level
rewards; the rollout's `turn_ids` tensor says which tokens belong to which turn.

The last `<answer>` is searched in the policy's own text: observation blocks are removed first,
so an answer tag inside a fetched page's text is never taken for the policy's answer. Both action
formats are scored alike: the tool_call format's final turn gives its answer in `<answer>` too.
"""

from __future__ import annotations

import json
import math
import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

from .actions import Fetch, Invalid, parse_fetch
from .tool_turns import parse_tool_calls

OBSERVATION_BLOCK = re.compile(r"<(result|tool_response)>.*?(</\1>|$)", re.DOTALL)
ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
TAG = re.compile(r"</?(think|search|fetch|crop|bbox|answer|result|tool_call|tool_response)>")
ARTICLES = re.compile(r"\b(a|an|the)\b")
PUNCTUATION = set(string.punctuation)
PARTS = ("accuracy", "f1", "format", "retrieval")


@dataclass(frozen=True)
class RewardWeights:
    """Weights of the parts in `overall` (EasyR1: `worker.reward.reward_function_kwargs`)."""

    accuracy: float = 0.5
    f1: float = 0.3
    format: float = 0.1
    retrieval: float = 0.1

    def __post_init__(self) -> None:
        for name in PARTS:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"reward weight {name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class GroundTruth:
    answer: str
    doc_id: Optional[str] = None
    gold_pages: tuple = ()
    page_ids: tuple = ()  # per observation, the page ids shown (added by the reward-manager patch)


def shown_pages(page_ids: Any) -> list[list[str]]:
    """The rollout's `page_ids` column entry of one row as the ground truth's `page_ids` field."""
    return [[str(page) for page in turn] for turn in (page_ids if page_ids is not None else ())]


def parse_ground_truth(raw: Any) -> GroundTruth:
    """A plain answer string, or the JSON object described in the module docstring (or a dict)."""
    if isinstance(raw, str):
        text = raw.strip()
        if not text.startswith("{"):
            return GroundTruth(answer=raw)
        try:
            raw = json.loads(text)
        except json.JSONDecodeError:
            return GroundTruth(answer=raw)  # an answer that happens to start with "{"
    if not isinstance(raw, Mapping):
        raise TypeError(f"ground truth must be a string or a JSON object, got {type(raw).__name__}")
    if not isinstance(raw.get("answer"), str):
        raise ValueError(f"ground truth object needs a string 'answer', got {raw!r}")
    pages = raw.get("gold_pages") or ()
    gold = tuple(gold_page(page) for page in pages)
    if None in gold:
        raise ValueError(f"gold_pages must be page numbers >= 1 or [document, page] pairs, got {pages!r}")
    shown = tuple(tuple(str(x) for x in turn) for turn in (raw.get("page_ids") or ()))
    return GroundTruth(answer=raw["answer"], doc_id=raw.get("doc_id"), gold_pages=gold, page_ids=shown)


def _page_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def gold_page(value: Any) -> Any:
    """A gold page as the ground truth writes it: a page number >= 1 (of the row's document) or a
    (document, page) pair (corpus scope); None for anything else."""
    if _page_number(value):
        return value
    if isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[0], str) and _page_number(value[1]):
        return value[0], value[1]
    return None


# ---- answers ----
def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def token_f1(prediction: str, truth: str) -> float:
    pred, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
    if not pred or not gold:
        return float(pred == gold)
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def policy_text(response: str) -> str:
    """The response without its observation blocks (an unterminated one runs to the end)."""
    return OBSERVATION_BLOCK.sub(" ", response)


def last_answer(response: str) -> Optional[str]:
    """The content of the last complete `<answer>…</answer>` the policy wrote, or None."""
    found = ANSWER_BLOCK.findall(policy_text(response))
    return found[-1].strip() if found else None


# ---- format ----
def format_score(response: str) -> float:
    """1.0 when the policy's actions are well formed and it gave exactly one final answer."""
    text = policy_text(response)
    stack: list = []
    blocks: list = []  # (tag, content) in order
    for number, match in enumerate(TAG.finditer(text)):
        closing, tag = match.group(0).startswith("</"), match.group(1)
        if number == 0 and closing and tag == "think":
            continue  # closes the <think> a thinking template's generation prompt opened
        if tag in ("result", "tool_response"):
            return 0.0  # a stray observation tag written by the policy
        if not closing:
            if stack:
                return 0.0  # tags do not nest
            stack.append((tag, match.end()))
        else:
            if not stack or stack[-1][0] != tag:
                return 0.0
            _, start = stack.pop()
            blocks.append((tag, text[start:match.start()]))
    if stack:
        return 0.0
    answers = [i for i, (tag, _) in enumerate(blocks) if tag == "answer"]
    if len(answers) != 1:
        return 0.0
    if any(tag in ("search", "fetch", "crop", "bbox", "tool_call") for tag, _ in blocks[answers[0] + 1:]):
        return 0.0
    for tag, content in blocks:
        if tag == "search" and not content.strip():
            return 0.0
        if tag == "fetch":
            if not isinstance(parse_fetch(content), Fetch):  # the rollout's own reader: what it would run
                return 0.0
        if tag == "tool_call" and not _executable(content):
            return 0.0
        if tag in ("crop", "bbox") and not _readable_region(tag, content):
            return 0.0
    return 1.0


def _readable_region(tag: str, body: str) -> bool:
    """A region action the rollout can read: `<crop>page, [box]</crop>` or `<bbox>[box]</bbox>`
    (whether the box fits the page is the rollout's to say, against the page as shown)."""
    from .regions import RegionError, parse_region

    try:
        page, _ = parse_region(body)
    except RegionError:
        return False
    return page is not None or tag == "bbox"


def _executable(call_body: str) -> bool:
    calls = parse_tool_calls(f"<tool_call>{call_body}</tool_call>", regions=True)  # a crop is an action too
    return len(calls) == 1 and not isinstance(calls[0], Invalid)


# ---- retrieval ----
def split_page_id(page_id: str) -> tuple:
    """`<doc>_<page>` -> (doc, page); doc ids may contain underscores."""
    doc, sep, page = page_id.rpartition("_")
    if not sep or not page.isdigit():
        raise ValueError(f"not a page id <doc>_<page>: {page_id!r}")
    return doc, int(page)


def ranked_pages(page_ids: Iterable[Iterable[str]]) -> list:
    """Distinct (doc, page) pairs in the order the episode was first shown them."""
    seen: dict = {}
    for turn in page_ids:
        for page_id in turn:
            seen.setdefault(split_page_id(page_id), None)
    return list(seen)


def ndcg(ranked: Sequence[Any], relevant: Iterable[Any]) -> float:
    """Binary-relevance NDCG of `ranked` against the set `relevant` (ideal DCG over all of it)."""
    relevant = set(relevant)
    if not relevant or not ranked:
        return 0.0
    dcg = sum(1.0 / math.log2(rank + 2) for rank, item in enumerate(ranked) if item in relevant)
    ideal = sum(1.0 / math.log2(rank + 2) for rank in range(len(relevant)))
    return dcg / ideal


def retrieval_score(truth: GroundTruth) -> float:
    if not truth.gold_pages:
        return 0.0
    ranked = ranked_pages(truth.page_ids)
    numbers = {page for page in truth.gold_pages if not isinstance(page, tuple)}
    if truth.doc_id is None and numbers:  # no document named: page numbers of whatever document was shown
        return ndcg(list(dict.fromkeys(page for _, page in ranked)), numbers)
    return ndcg(ranked, {page if isinstance(page, tuple) else (truth.doc_id, page) for page in truth.gold_pages})


def turn_retrieval_scores(turn_page_ids: Sequence[Iterable[str]], ground_truth: Any) -> list[float]:
    """A per-turn retrieval signal (for turn-level rewards): for each turn, the NDCG of the pages
    its observations showed that no earlier turn had shown, in the order shown, against the gold
    pages (a turn that showed nothing new scores 0). `turn_page_ids` is the rollout's column of
    that name: per turn, the page ids shown after it."""
    truth = parse_ground_truth(ground_truth)
    seen: set = set()
    scores = []
    for pages in turn_page_ids:
        new = [page for page in ranked_pages([pages]) if page not in seen]
        seen.update(new)
        scores.append(retrieval_score(GroundTruth(truth.answer, truth.doc_id, truth.gold_pages,
                                                  ([f"{doc}_{page}" for doc, page in new],))))
    return scores


# ---- the score ----
def score_response(response: str, ground_truth: Any, weights: RewardWeights = RewardWeights()) -> dict:
    """All parts and `overall` for one episode (see the module docstring)."""
    truth = parse_ground_truth(ground_truth)
    answer = last_answer(response)
    parts = {
        "accuracy": exact_match(answer, truth.answer) if answer is not None else 0.0,
        "f1": token_f1(answer, truth.answer) if answer is not None else 0.0,
        "format": format_score(response),
        "retrieval": retrieval_score(truth),
    }
    overall = sum(getattr(weights, name) * parts[name] for name in PARTS)
    return {"overall": overall, **parts}


def compute_scores(reward_inputs: Sequence[Mapping[str, Any]], **weights: float) -> list:
    """EasyR1's batch reward function: `[{response, response_length, ground_truth}] -> [scores]`."""
    unknown = set(weights) - set(PARTS)
    if unknown:
        raise TypeError(f"unknown reward weights {sorted(unknown)}; known: {list(PARTS)}")
    resolved = RewardWeights(**weights)
    return [score_response(item["response"], item["ground_truth"], resolved) for item in reward_inputs]
