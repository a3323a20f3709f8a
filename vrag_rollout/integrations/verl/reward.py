"""The project's reward in verl's signature (`reward.custom_reward_function`; pure glue).

verl's reward manager calls `compute_score(data_source, solution_str, ground_truth, extra_info,
**reward_kwargs)` once per trajectory, with the whole decoded response (observations included)
and the row's `reward_model.ground_truth`; `extra_info` holds the row's `extra_info` plus the
loop's `tool_extra_fields`, where `vrag_agent` puts the pages each observation showed. The result
is `core.reward.score_response`'s parts with `score` = `overall` (verl logs the other keys).
`reward_kwargs` are the part weights (`accuracy`, `f1`, `format`, `retrieval`).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional

from ...core.reward import PARTS, RewardWeights, score_response


def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Optional[Mapping] = None,
                  **kwargs: Any) -> dict:
    weights = RewardWeights(**{name: kwargs[name] for name in PARTS if name in kwargs})
    truth = ground_truth
    pages = (extra_info or {}).get("page_ids")
    if pages is not None:
        truth = json.loads(truth) if isinstance(truth, str) and truth.strip().startswith("{") else truth
        truth = {**truth, "page_ids": pages} if isinstance(truth, Mapping) else {"answer": truth, "page_ids": pages}
    parts = score_response(solution_str, truth, weights)
    return {"score": parts["overall"], **parts}
