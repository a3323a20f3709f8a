"""VRAG-RL's rule that an answer is scored only after a search. Pure.

Source: github.com/Alibaba-NLP/VRAG, `VRAG-RL/verl/utils/reward_score/vrag.py`
(`compute_format_reward_only`, `remove_text_between_tags`) and
`VRAG-RL/verl/workers/reward_manager/rm.py` (`RMManager.__call__`). In evaluation VRAG-RL's score
of an episode is the judge's verdict only when its response, with the user turns (the
observations) removed, holds both `<answer>…</answer>` and `<search>…</search>`; any other
episode scores 0 and the judge is not asked. `Protocol.search_required` decides where the rule
applies (by default ViDoSeek, the set scored under VRAG-RL's protocol).

- `searched(response, searches)`: whether the policy searched: a `<search>` later closed by a
  `</search>` in the policy's own text (`core.reward.policy_text`: observation blocks removed),
  as VRAG-RL tests it, or at least one search call (`searches`, the episode's count: in the
  tool-call format a search is a tool call, not a tag);
- `without_search(row)`: a scorer's row for an answer given without a search: every score 0,
  flags kept, `unsearched` 1.0 (the report counts it).
"""

from __future__ import annotations

import re

from vrag_rollout.core.reward import policy_text

SEARCH_BLOCK = re.compile(r"<search>.*</search>", re.DOTALL)  # greedy, as VRAG-RL's pattern
SCORES = ("accuracy", "f1", "contains", "judge")  # what the rule sets to 0; other keys are flags


def searched(response: str, searches: int = 0) -> bool:
    return searches > 0 or SEARCH_BLOCK.search(policy_text(response)) is not None


def without_search(row: dict) -> dict:
    return {**row, **{key: 0.0 for key in SCORES if key in row}, "unsearched": 1.0}


__all__ = ["searched", "without_search"]
