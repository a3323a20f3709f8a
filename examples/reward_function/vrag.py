"""EasyR1 reward function for vrag episodes (`worker.reward.reward_function` in the example yamls).

A thin loader: the scoring lives in `vrag_rollout.core.reward` (see its docstring for the parts, the
ground-truth format and the weights). Weights come from `worker.reward.reward_function_kwargs`,
e.g. `{accuracy: 0.5, f1: 0.3, format: 0.1, retrieval: 0.1}`.
"""

from vrag_rollout.core.reward import compute_scores

REWARD_NAME = "vrag"
REWARD_TYPE = "batch"


def compute_score(reward_inputs, **weights):
    return compute_scores(reward_inputs, **weights)
