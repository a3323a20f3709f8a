"""verl reward function for vrag episodes (`reward.custom_reward_function.path` in examples/verl).

A thin loader: the scoring is `vrag_rollout.core.reward`, through
`vrag_rollout.integrations.verl.reward` (verl's signature). Part weights come from
`reward.custom_reward_function.reward_kwargs`, e.g. `{accuracy: 0.5, f1: 0.3, format: 0.1, retrieval: 0.1}`.
"""

from vrag_rollout.integrations.verl.reward import compute_score

__all__ = ["compute_score"]
