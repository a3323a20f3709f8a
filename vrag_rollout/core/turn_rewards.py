"""Per-turn rewards: what each turn's action earned. Pure.

Contract: `turn_rewards(turn_page_ids, episode_score, ground_truth, weights, reward_weights,
turn_actions=None)` returns a `TurnRewards` for one episode of T turns (T = len(turn_page_ids), the
rollout's `turn_page_ids` column: per turn, the page ids shown after it):

- `total[t]`: the reward of turn t (0-based), the sum of its `parts`;
- `parts[name][t]` for `PARTS`:
  * `retrieval`: with `weights.retrieval_by_turn`, `reward_weights.retrieval` x the share of the
    episode's retrieval NDCG that turn t earned: each distinct page's DCG term (binary relevance,
    its rank in the order first shown) goes to the turn that first showed it, divided by the ideal
    DCG, so the shares sum to `core.reward.retrieval_score` exactly (up to float rounding);
  * `new_gold`: `weights.new_gold` x the gold pages turn t showed first;
  * `repeat_page`: -`weights.repeat_page` x the pages turn t showed that an earlier turn (or itself)
    had already shown;
  * `repeat_query`: -`weights.repeat_query` when turn t searched a query (normalised: lower case,
    single spaces) an earlier turn had searched (needs `turn_actions`);
  * `invalid`: -`weights.invalid` when turn t's action was invalid (needs `turn_actions`);
  * `outcome`: on the last turn only, the episode's `overall` reward, less the retrieval part when
    that part went to the turns (`retrieval_by_turn`); 0 on the others.

Invariant: with the per-turn parts off (`TurnRewardWeights()`, every weight 0 and
`retrieval_by_turn` False) the only non-zero part is `outcome` on the last turn, equal to the
episode's `overall` bit for bit, so every estimator sees today's reward; with only
`retrieval_by_turn` on, the total still sums to `overall` (the retrieval part is moved, not added).
The shaping parts (`new_gold`, `repeat_*`, `invalid`) add to it.

`turn_action(text)` reads the action a turn's sampled text ends with (tags or a tool call), as
`TurnAction(kind, key)`: kind "search" (key: the normalised query), "fetch", "crop", "answer",
"invalid" or "none".
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from .actions import Fetch, Invalid, Search, parse_fetch
from .reward import RewardWeights, parse_ground_truth, split_page_id

PARTS = ("outcome", "retrieval", "new_gold", "repeat_page", "repeat_query", "invalid")


@dataclass(frozen=True)
class TurnRewardWeights:
    """The per-turn parts' weights (all off by default: today's reward, on the last turn)."""

    retrieval_by_turn: bool = False
    new_gold: float = 0.0
    repeat_page: float = 0.0
    repeat_query: float = 0.0
    invalid: float = 0.0

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name != "retrieval_by_turn" and (not isinstance(value, (int, float)) or not math.isfinite(value)
                                                     or value < 0):
                raise ValueError(f"turn reward weight {item.name} must be a finite number >= 0, got {value!r}")

    @property
    def off(self) -> bool:
        return not self.retrieval_by_turn and not any((self.new_gold, self.repeat_page, self.repeat_query, self.invalid))


# `learn --turn-rewards NAME`, EasyR1's / verl's `turn_rewards` setting.
PRESETS = {
    "off": TurnRewardWeights(),
    "retrieval": TurnRewardWeights(retrieval_by_turn=True),
    "on": TurnRewardWeights(retrieval_by_turn=True, new_gold=0.1, repeat_page=0.05, repeat_query=0.05, invalid=0.05),
}


def preset(name: Any) -> TurnRewardWeights:
    if isinstance(name, TurnRewardWeights):
        return name
    if name not in PRESETS:
        raise ValueError(f"turn rewards must be one of {', '.join(PRESETS)}, got {name!r}")
    return PRESETS[name]


@dataclass(frozen=True)
class TurnAction:
    kind: str  # search | fetch | crop | answer | invalid | none
    key: str | None = None  # the normalised query of a search


@dataclass(frozen=True)
class TurnRewards:
    total: list
    parts: dict  # name -> list, one value per turn


# ---- reading a turn's action ----
_LAST_TAG = re.compile(r"<(search|fetch|answer|crop|bbox)>(.*?)</\1>", re.DOTALL)


def normalise_query(query: str) -> str:
    return " ".join(query.lower().split())


def turn_action(text: str) -> TurnAction:
    """The action the turn's sampled text ends with (see the module docstring)."""
    if "<tool_call>" in text:
        from .tool_turns import parse_tool_calls

        calls = parse_tool_calls(text, regions=True)
        if calls:
            call = calls[0]
            if isinstance(call, Invalid):
                return TurnAction("invalid")
            if isinstance(call, Search):
                return TurnAction("search", normalise_query(call.query))
            return TurnAction("fetch" if isinstance(call, Fetch) else "crop")
    found = list(_LAST_TAG.finditer(text))
    if not found:
        return TurnAction("none")
    tag, body = found[-1].group(1), found[-1].group(2)
    if tag == "answer":
        return TurnAction("answer")
    if tag == "search":
        return TurnAction("search", normalise_query(body)) if body.strip() else TurnAction("invalid")
    if tag == "fetch":
        return TurnAction("fetch") if isinstance(parse_fetch(body.strip()), Fetch) else TurnAction("invalid")
    return TurnAction("crop")


# ---- retrieval shares ----
def retrieval_shares(turn_page_ids: Sequence[Iterable[str]], ground_truth: Any) -> tuple[list, list]:
    """(per turn, its share of the episode's NDCG; per turn, the gold pages it showed first),
    ranking pages as `core.reward.retrieval_score` does."""
    truth = parse_ground_truth(ground_truth)
    turns = [[split_page_id(str(page)) for page in pages] for pages in turn_page_ids]
    shares, gold_first = [0.0] * len(turns), [0] * len(turns)
    if not truth.gold_pages:
        return shares, gold_first
    numbers = {page for page in truth.gold_pages if not isinstance(page, tuple)}
    by_number = truth.doc_id is None and bool(numbers)
    relevant = numbers if by_number else {p if isinstance(p, tuple) else (truth.doc_id, p) for p in truth.gold_pages}
    ideal = sum(1.0 / math.log2(rank + 2) for rank in range(len(relevant)))
    seen: set = set()
    for turn, pages in enumerate(turns):
        for page in pages:
            item = page[1] if by_number else page
            if item in seen:
                continue
            rank = len(seen)
            seen.add(item)
            if item in relevant:
                shares[turn] += 1.0 / math.log2(rank + 2) / ideal
                gold_first[turn] += 1
    return shares, gold_first


def repeated_pages(turn_page_ids: Sequence[Iterable[str]]) -> list:
    """Per turn, the pages it showed that had been shown before (in the episode, itself included)."""
    seen: set = set()
    out = []
    for pages in turn_page_ids:
        count = 0
        for page in pages:
            item = split_page_id(str(page))
            count += item in seen
            seen.add(item)
        out.append(count)
    return out


def turn_rewards(turn_page_ids: Sequence[Iterable[str]], episode_score: Mapping[str, float], ground_truth: Any,
                 weights: TurnRewardWeights = TurnRewardWeights(), reward_weights: RewardWeights = RewardWeights(),
                 turn_actions: Sequence[TurnAction] | None = None) -> TurnRewards:
    """Each turn's reward (module docstring). `episode_score` is `core.reward.score_response`'s dict."""
    turns = len(turn_page_ids)
    if turns == 0:
        return TurnRewards([], {name: [] for name in PARTS})
    parts = {name: [0.0] * turns for name in PARTS}
    outcome = float(episode_score["overall"])
    if weights.retrieval_by_turn:
        shares, _ = retrieval_shares(turn_page_ids, ground_truth)
        parts["retrieval"] = [reward_weights.retrieval * share for share in shares]
        outcome -= reward_weights.retrieval * float(episode_score["retrieval"])
    parts["outcome"][-1] = outcome
    if weights.new_gold:
        _, gold_first = retrieval_shares(turn_page_ids, ground_truth)
        parts["new_gold"] = [weights.new_gold * count for count in gold_first]
    if weights.repeat_page:
        parts["repeat_page"] = [-weights.repeat_page * count for count in repeated_pages(turn_page_ids)]
    if (weights.repeat_query or weights.invalid) and turn_actions is not None:
        if len(turn_actions) != turns:
            raise ValueError(f"{len(turn_actions)} turn actions for {turns} turns")
        queries: set = set()
        for turn, action in enumerate(turn_actions):
            if action.kind == "search" and weights.repeat_query:
                parts["repeat_query"][turn] = -weights.repeat_query * (action.key in queries)
                queries.add(action.key)
            if action.kind == "invalid":
                parts["invalid"][turn] = -weights.invalid
    if weights.off:
        total = [0.0] * turns
        total[-1] = outcome  # exactly `overall`, no float sums
    else:
        total = [sum(parts[name][turn] for name in PARTS) for turn in range(turns)]
    return TurnRewards(total, parts)


__all__ = ["PARTS", "PRESETS", "TurnAction", "TurnRewardWeights", "TurnRewards", "normalise_query", "preset",
           "repeated_pages", "retrieval_shares", "turn_action", "turn_rewards"]
