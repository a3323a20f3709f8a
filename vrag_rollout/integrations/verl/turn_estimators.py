"""The turn-level estimators in volcengine verl: `algorithm.adv_estimator=vrag_turn` or `vrag_gigpo`.

`register()` (run on import) puts both names in verl's registry (`core_algos.register_adv_est`),
with verl's custom-estimator signature: `(token_level_rewards, response_mask, index, config, ...)`
-> (advantages, returns). verl's `ray_trainer.compute_advantage` passes a custom estimator no
non-tensor column (only `gdpo` gets `batch` and `non_tensor_batch`), so on its own an estimator
sees turns as runs of sampled tokens (`training/estimators.turns_from_mask`: `response_mask` is 0 on
tool responses) and each turn's reward as what `token_level_rewards` holds on its tokens.
`patch_compute_advantage()` wraps `compute_advantage` (in `ray_trainer` and in the v1 trainer's
`utils`, which imported it by name) to hand our names the batch as verl hands `gdpo` its: the
rollout's `turn_ids` (the guard's worker makes them a (B, R) tensor), the `turn_page_ids` column
(rebuilt from `page_ids` when absent: each turn's observation tokens, in order, hold the next
observation's pages) and `ground_truth` (`reward_model.ground_truth`); gigpo needs that. The step's
credit metrics (`reward/turn/K/mean`, `advantage/turn/K/mean|std`) ride in the batch's
`meta_info["vrag_credit"]` to `ray_trainer.compute_data_metrics` (wrapped too), whose result the
trainer logs. `integrations/verl/guard.install_trainer_metrics` (the guarded manager) installs the
patch in the driver.
Per-turn rewards: `VRAG_TURN_REWARDS` (off|retrieval|on, default off) in the trainer's environment.
"""

from __future__ import annotations

import os
from typing import Any

NAMES = {"vrag_turn": "turn", "vrag_gigpo": "gigpo"}
TURN_REWARDS_ENV = "VRAG_TURN_REWARDS"
MARK = "__vrag_credit__"
METRICS_KEY = "vrag_credit"
LAST_METRICS: dict = {}


def turn_page_ids_from(page_ids: Any, turn_ids: Any, response_mask: Any) -> list:
    """Per row, per turn, the pages of its observations: the k-th run of observation tokens
    (`turn_ids` > 0, `response_mask` 0) holds `page_ids[k]`."""
    out = []
    for row, pages in enumerate(page_ids):
        ids, sampled = turn_ids[row].tolist(), response_mask[row].tolist()
        turns = max(ids) if ids else 0
        per_turn: list = [[] for _ in range(turns)]
        observation, previous = -1, None
        for turn, taken in zip(ids, sampled):
            key = (turn, bool(taken))
            if turn > 0 and not taken and key != previous:
                observation += 1
                if observation < len(pages):
                    per_turn[turn - 1].extend(str(p) for p in pages[observation])
            previous = key
        out.append(per_turn)
    return out


def make_estimator(name: str) -> Any:
    def estimator(token_level_rewards: Any, response_mask: Any, index: Any = None, config: Any = None,
                  batch: Any = None, non_tensor_batch: dict | None = None, **kwargs: Any) -> tuple:
        from ...training.turn_credit import trainer_credit

        turn_ids = batch.get("turn_ids", None) if batch is not None else None
        columns = dict(non_tensor_batch or {})
        if "turn_page_ids" not in columns and "page_ids" in columns and turn_ids is not None:
            columns["turn_page_ids"] = turn_page_ids_from(columns["page_ids"], turn_ids, response_mask)
        if "ground_truth" not in columns and "reward_model" in columns:
            columns["ground_truth"] = [row.get("ground_truth") for row in columns["reward_model"]]
        advantages, metrics = trainer_credit(NAMES[name], token_level_rewards, response_mask,
                                             range(len(response_mask)) if index is None else index, turn_ids,
                                             columns, os.environ.get(TURN_REWARDS_ENV, "off"))
        LAST_METRICS.clear()
        LAST_METRICS.update(metrics)
        return advantages, advantages

    estimator.__name__ = f"compute_{name}_advantage"
    return estimator


ESTIMATORS = {name: make_estimator(name) for name in NAMES}


def register() -> None:
    """Both names in verl's registry (idempotent: the same functions each time)."""
    from verl.trainer.ppo import core_algos

    for name, fn in ESTIMATORS.items():
        if core_algos.ADV_ESTIMATOR_REGISTRY.get(name) is not fn:
            core_algos.register_adv_est(name)(fn)


def patch_compute_advantage() -> bool:
    """Our names get the batch and its columns (module docstring); True when newly patched."""
    import importlib

    trainer = importlib.import_module("verl.trainer.ppo.ray_trainer")
    install_metrics(trainer)
    original = trainer.compute_advantage
    if getattr(original, MARK, False):
        return False

    def compute_advantage(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
        name = str(getattr(adv_estimator, "value", adv_estimator))
        if name not in NAMES:
            return original(data, adv_estimator, *args, **kwargs)
        index = data.non_tensor_batch.get("uid")
        advantages, returns = ESTIMATORS[name](data.batch["token_level_rewards"], data.batch["response_mask"], index,
                                               batch=data.batch, non_tensor_batch=data.non_tensor_batch)
        data.batch["advantages"], data.batch["returns"] = advantages, returns
        data.meta_info[METRICS_KEY] = {k: v for k, v in LAST_METRICS.items() if k != "estimator"}
        return data

    setattr(compute_advantage, MARK, True)
    trainer.compute_advantage = compute_advantage
    try:
        utils = importlib.import_module("verl.trainer.ppo.v1.utils")
        utils.compute_advantage = compute_advantage
    except ImportError:  # a verl without the v1 trainer
        pass
    return True


def install_metrics(trainer: Any) -> None:
    """`compute_data_metrics` adds the batch's `meta_info["vrag_credit"]`; installed beneath the
    guard's wrapper when that is there (`guard.install_trainer_metrics`), once."""
    current = trainer.compute_data_metrics
    inner = current.__wrapped__ if getattr(current, "vrag_guard", False) else current
    if getattr(inner, MARK, False):
        return

    def wrapped(batch: Any, *args: Any, **kwargs: Any) -> dict:
        return {**inner(batch, *args, **kwargs), **(batch.meta_info.get(METRICS_KEY) or {})}

    setattr(wrapped, MARK, True)
    if inner is current:
        trainer.compute_data_metrics = wrapped
    else:  # the guard's wrapper, around ours now
        trainer.compute_data_metrics = current.rewrap(wrapped)


register()

__all__ = ["ESTIMATORS", "LAST_METRICS", "NAMES", "TURN_REWARDS_ENV", "install_metrics", "make_estimator",
           "patch_compute_advantage",
           "register", "turn_page_ids_from"]
