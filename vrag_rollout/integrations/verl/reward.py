"""The project's reward in verl's signature (`reward.custom_reward_function`; pure glue).

verl's reward manager calls `compute_score(data_source, solution_str, ground_truth, extra_info,
**reward_kwargs)` once per trajectory, with the whole decoded response (observations included)
and the row's `reward_model.ground_truth`; `extra_info` holds the row's `extra_info` plus the
loop's `tool_extra_fields`, where `vrag_agent` puts the pages each observation showed. The result
is `core.reward.score_response`'s parts with `score` = `overall` (verl logs the other keys).
`reward_kwargs` are the part weights (`accuracy`, `f1`, `format`, `retrieval`).

A row without `page_ids` in `extra_info` is refused, naming both causes and their fixes: some
other loop rolled it out (no retrieval to score), or a reward manager that drops the loop's
`tool_extra_fields` scored it (the retrieval part would silently read no pages). verl's `naive`
and `remote` managers pass the error on and the step fails; `limited` catches it, logs it and
scores the row 0 with the message in `reward_extra_info["error"]`.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional

from ...core.reward import PARTS, RewardWeights, score_response


NOT_VRAG_ROW = (
    "vrag reward: extra_info has no 'page_ids', which vrag_agent puts in every row's tool_extra_fields. Either "
    "the row was not rolled out by vrag_agent (rows choose their loop by agent_name, or by "
    "actor_rollout_ref.rollout.agent.default_agent_loop=vrag_agent; verl's fully async trainer gives every row "
    "single_turn_agent unless actor_rollout_ref.rollout.multi_turn.enable=true), or the reward manager does not "
    "pass the loop's tool_extra_fields on (verl 0.9.1's naive, limited and remote managers do; dapo and gdpo do not)")


def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Optional[Mapping] = None,
                  **kwargs: Any) -> dict:
    weights = RewardWeights(**{name: kwargs[name] for name in PARTS if name in kwargs})
    truth = ground_truth
    pages = (extra_info or {}).get("page_ids")
    if pages is None:
        raise ValueError(NOT_VRAG_ROW)
    truth = json.loads(truth) if isinstance(truth, str) and truth.strip().startswith("{") else truth
    truth = {**truth, "page_ids": pages} if isinstance(truth, Mapping) else {"answer": truth, "page_ids": pages}
    parts = score_response(solution_str, truth, weights)
    return {"score": parts["overall"], **parts}
