"""What the view says of an episode besides its tokens: question, ground truth, reward, budget end.

Display only, from what the batch carries: `verify/` imports only `verify/` (tests/test_layers.py),
so nothing here computes a reward; the reward is `core.reward`'s, shown when the batch holds it.

- `question(prompt_text)`: the question of a prompt decoded without its vision blocks: the last
  user turn's text after its first "\\nQuestion: " (how `data.prompts.render_prompt` writes it),
  else that whole turn's text, else the whole prompt's.
- `policy_answer(sampled_text)`: the last `<answer>…</answer>` the policy wrote, or None.
- `ground_truth(saved, row, truths)`: a `Truth` from the column `ground_truth` (EasyR1) or
  `answer` (`convert-dataset`), a plain answer string or the JSON object
  `{"answer", "doc_id", "gold_pages"}` that core/reward.py reads; else from `truths` (a
  `load_truths` file) by the episode's question; None when neither has one.
- `reward(saved, row)`: {"overall", and the parts the batch has} from the column `reward` (a
  number, or the dict `core.reward.score_response` returns) or EasyR1's `token_level_scores`
  tensor (its row sum: `overall` only); None when the batch carries neither.
- `is_gold(page_id, truth, doc_id)`: a shown page id `<doc>_<page>` is one of the gold pages.
- `budget_note(...)`: why a `budget` episode ended: the turn whose result did not fit and what
  that turn asked for; from the column `budget_overflow` when the rollout records it (per row
  None or {"turn", "tokens", "remaining", "page_ids"}: the tokens the smallest observation
  needed, the tokens left, the pages it would have shown), else inferred from the last action.
- `load_truths(path)`: {question: ground truth} from a `convert-dataset` parquet (`prompt`,
  `answer`) or a JSON object {question: ground truth}.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

QUESTION_MARK = "\nQuestion: "  # data/prompts.py joins the instructions and the question with it
USER_TURN = re.compile(r"<\|im_start\|>user\n(.*?)(?:<\|im_end\|>|$)", re.DOTALL)
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
ACTION = re.compile(r"<(search|fetch|tool_call)>(.*?)(?:</\1>|$)", re.DOTALL)
REWARD_PARTS = ("accuracy", "f1", "format", "retrieval")
TRUTH_COLUMNS = ("ground_truth", "answer")


@dataclass(frozen=True)
class Truth:
    answer: str
    doc_id: Optional[str] = None
    gold_pages: tuple = ()


# ---- question ----
def question(prompt_text: str) -> str:
    turns = USER_TURN.findall(prompt_text)
    text = turns[-1] if turns else prompt_text
    _, mark, asked = text.partition(QUESTION_MARK)  # the first mark: a question may hold one itself
    return (asked if mark else text).strip()


def comparable(text: str) -> str:
    """A question as truths are matched by it: whitespace runs made one space."""
    return " ".join(text.split())


def policy_answer(sampled_text: str) -> Optional[str]:
    found = ANSWER.findall(sampled_text)
    return found[-1].strip() if found else None


# ---- ground truth ----
def parse_truth(raw: Any) -> Optional[Truth]:
    """A plain answer string or a {"answer", "doc_id", "gold_pages"} object (or its JSON); None
    for anything else (a view shows what it can rather than refusing a batch)."""
    if isinstance(raw, str) and raw.strip().startswith("{"):
        try:
            raw = json.loads(raw)
        except ValueError:
            return Truth(answer=raw)  # an answer that happens to start with "{"
    if isinstance(raw, str):
        return Truth(answer=raw)
    if not isinstance(raw, Mapping) or raw.get("answer") is None:
        return None
    # a page number of the row's document, or a (document, page) pair (corpus scope)
    pages = tuple(tuple(p) if isinstance(p, list) else p for p in raw.get("gold_pages") or ()
                  if (isinstance(p, int) and not isinstance(p, bool))
                  or (isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], int)))
    doc = raw.get("doc_id")
    return Truth(answer=str(raw["answer"]), doc_id=None if doc is None else str(doc), gold_pages=pages)


def ground_truth(saved: Any, row: int, truths: Optional[Mapping[str, Any]] = None,
                 asked: Optional[str] = None) -> Optional[Truth]:
    for name in TRUTH_COLUMNS:
        if name in saved.columns and saved.columns[name][row] is not None:
            return parse_truth(saved.columns[name][row])
    if truths and asked is not None:
        raw = truths.get(comparable(asked))
        return None if raw is None else parse_truth(raw)
    return None


def is_gold(page_id: str, truth: Optional[Truth], doc_id: Any = None) -> bool:
    if truth is None or not truth.gold_pages:
        return False
    doc, sep, page = str(page_id).rpartition("_")
    if not sep or not page.isdigit():
        return False
    if (doc, int(page)) in truth.gold_pages:  # a (document, page) pair: corpus scope
        return True
    wanted = truth.doc_id if truth.doc_id is not None else doc_id
    return int(page) in truth.gold_pages and (wanted is None or doc == str(wanted))


# ---- reward ----
def reward(saved: Any, row: int) -> Optional[dict]:
    value = saved.columns["reward"][row] if "reward" in saved.columns else None
    if isinstance(value, Mapping) and isinstance(value.get("overall"), (int, float)):
        return {"overall": float(value["overall"]),
                **{k: float(value[k]) for k in REWARD_PARTS if isinstance(value.get(k), (int, float))}}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {"overall": float(value)}
    scores = saved.tensors.get("token_level_scores")
    if scores is not None:  # EasyR1 puts the score on the last response token
        return {"overall": float(scores[row].sum())}
    return None


# ---- budget ----
def _action(kind: str, body: str) -> str:
    if kind == "tool_call":
        try:
            call = json.loads(body)
            return f"{call['name']} {json.dumps(call.get('arguments', {}), ensure_ascii=False)}"
        except (ValueError, KeyError, TypeError, RecursionError):  # a policy's JSON is hostile input
            pass
    return f"{kind} {comparable(body)}"


def last_actions(sampled_text: str) -> list[str]:
    """The tool calls of a turn's sampled text, as `search {...}` / `fetch image, 3` lines."""
    return [_action(kind, body) for kind, body in ACTION.findall(sampled_text)]


def budget_note(*, turn: int, last_sampled: str, last_is_observation: bool, remaining: int, length: int,
                last_pages: Sequence[str] = (), overflow: Any = None, brief: bool = False) -> str:
    """Why a `budget` episode ended, in one sentence (see the module docstring). `last_sampled`:
    the last turn's sampled text; `last_pages`: the pages of the last observation; `brief`:
    without the turn's actions (for the episode table)."""
    asked = "; ".join(last_actions(last_sampled)) or "its action"
    if isinstance(overflow, Mapping):
        pages = ", ".join(map(str, overflow.get("page_ids") or ())) or "its result"
        tokens = overflow.get("tokens")
        what = f"the result of turn {overflow.get('turn', turn)}" + ("" if brief else f" ({asked})")
        return (f"{what}: {pages} ({tokens if tokens is not None else '?'} tokens) "
                f"did not fit the {overflow.get('remaining', remaining)} tokens left of {length}")
    if last_is_observation and remaining <= 0:  # the result fitted, to the last token
        shown = f": {', '.join(map(str, last_pages))}" if last_pages else ""
        return (f"the result of turn {turn} ({asked}{shown}) filled the response to its last token ({length}): "
                "no room left to sample")
    if brief:
        return f"the result of turn {turn} did not fit the {remaining} tokens left of {length}"
    return (f"the result of turn {turn} ({asked}) did not fit the {remaining} tokens left of {length}; "
            "the batch does not record what that result held")


# ---- a ground-truth file ----
def load_truths(path: str | Path) -> dict[str, Any]:
    """{question (whitespace normalized): ground truth}; ValueError for a file of another shape."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such truths file: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        if not {"prompt", "answer"} <= set(table.column_names):
            raise ValueError(f"{path}: a parquet of ground truths needs the columns prompt and answer "
                             "(as `vrag-rollout convert-dataset` writes)")
        rows = table.select(["prompt", "answer"]).to_pylist()
        return {comparable(question(str(r["prompt"]))): r["answer"] for r in rows}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from e
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a JSON object {{question: ground truth}}, got {type(data).__name__}")
    return {comparable(str(k)): v for k, v in data.items()}
