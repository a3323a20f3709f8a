"""EasyR1's advantage estimators on agent batches, where `response_mask` (the agent's
`loss_mask`) is 0 on observation tokens inside a response, not only after its end.

* GRPO, GRPO pass@k, RLOO: they use `token_level_rewards.sum(-1)` times the mask, so an
  observation token simply gets no gradient; nothing to change.
* REINFORCE++: EasyR1 resets its running return wherever the mask is 0 ("reset after EOS"),
  which at an observation cuts every earlier turn off from the outcome reward.
  `skip_observation_returns` instead carries the running return through masked tokens without
  discounting it (adding any reward found there), so the returns on the sampled tokens are those
  EasyR1 computes on the policy's own token sequence with the observations deleted. After the end
  of a response the rewards are 0 and the running return stays 0, so for a mask without holes
  this is EasyR1's function exactly. Installed as `ADV_ESTIMATOR_MAP["reinforce_plus_plus"]`.
* ReMax: the trainer unions the greedy baseline rollout's output into its batch and then pops
  only the baseline's tensors, so its non-tensor columns (`multi_modal_data`, ...) stay and
  collide with the real rollout's ("Key already exists: multi_modal_data"). The adapter
  (`rollout_adapter`) returns the baseline output stripped to its tensors, plus its page ids
  under `vrag_baseline_page_ids` (a name the real output does not use) so the baseline's
  retrieval reward is computed like the samples'; `is_remax_baseline` recognises that call.
* GAE: refused in `check_agent_config` (see `config_schema.REFUSED_ESTIMATORS`).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from .common import BASELINE_PAGES_COLUMN, GENERATION_MARK, mark_patched

REINFORCE_PLUS_PLUS = "reinforce_plus_plus"


def skip_observation_returns(token_level_rewards: Any, response_mask: Any, gamma: float) -> Any:
    """Discounted returns over the sampled tokens only; 0 at masked positions."""
    import torch

    mask = response_mask.bool()
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        reward = token_level_rewards[:, t]
        running = torch.where(mask[:, t], reward + gamma * running, running + reward)
        returns[:, t] = torch.where(mask[:, t], running, torch.zeros_like(running))
    return returns


def make_reinforce_plus_plus(whiten: Callable[[Any, Any], Any]) -> Callable:
    """EasyR1's REINFORCE++ signature and outputs, with `skip_observation_returns`.

    `whiten` is EasyR1's own `verl.utils.torch_functional.masked_whiten` when installed.
    """

    def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, gamma, **kwargs):
        returns = skip_observation_returns(token_level_rewards, response_mask, gamma)
        return whiten(returns, response_mask), returns

    return compute_reinforce_plus_plus_outcome_advantage


def patch_core_algos(module: Any) -> dict:
    """Replace REINFORCE++ in `verl.trainer.core_algos.ADV_ESTIMATOR_MAP` (idempotent)."""
    import torch
    from verl.utils.torch_functional import masked_whiten

    table = module.ADV_ESTIMATOR_MAP
    current = table[REINFORCE_PLUS_PLUS]
    done = {"estimators": not hasattr(current, "__vrag_original__")}
    if done["estimators"]:
        table[REINFORCE_PLUS_PLUS] = mark_patched(torch.no_grad()(make_reinforce_plus_plus(masked_whiten)), current)
    return done


def is_remax_baseline(meta_info: Mapping[str, Any]) -> bool:
    """The trainer's ReMax baseline generation: a copy of a training generation batch (marked by
    the generation pop) with `temperature=0` and `n=1` put into its meta_info. Validation
    batches get a fresh meta_info, so they never carry the mark."""
    return bool(meta_info.get(GENERATION_MARK)) and meta_info.get("temperature") == 0 and meta_info.get("n") == 1


def strip_baseline_output(output: Any) -> Any:
    """The baseline output as the trainer can take it: its tensors (which the trainer pops again
    after scoring), its page ids under a column the real output does not have, no meta_info."""
    columns = {}
    if "page_ids" in output.non_tensor_batch:
        columns[BASELINE_PAGES_COLUMN] = output.non_tensor_batch["page_ids"]
    return type(output)(batch=output.batch, non_tensor_batch=columns, meta_info={})
