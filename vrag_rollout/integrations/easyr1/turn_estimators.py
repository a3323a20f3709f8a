"""The turn-level estimators in EasyR1: `algorithm.adv_estimator: vrag_turn` or `vrag_gigpo`.

EasyR1 (b44b311) refuses an estimator name outside its `AdvantageEstimator` enum
(`ray_trainer.RayPPOTrainer.__init__`), and its `compute_advantage` passes an estimator only
`token_level_rewards`, `response_mask`, `index` (uid), `gamma` and `lam`, while turn credit needs the
rollout's `turn_ids` and, for gigpo, `turn_page_ids`. So, as the integration patches EasyR1 elsewhere:

- `patch_core_algos(module)`: `AdvantageEstimator` becomes an enum with EasyR1's members plus
  `VRAG_TURN`, `VRAG_GIGPO` (same values for the old ones, so every comparison EasyR1 makes holds),
  and `ADV_ESTIMATOR_MAP` gets both names (tensors only: turns from the mask's runs);
- `patch_ray_trainer(module)`: its `AdvantageEstimator` name is the extended enum (the config check
  passes), `compute_advantage` hands our names the whole batch (`turn_ids`, `turn_page_ids`,
  `ground_truth`) through `training.turn_credit.trainer_credit` and keeps the step's credit metrics
  in `meta_info["vrag_credit"]`, and `compute_data_metrics` adds them to the step's logged metrics
  (`reward/turn/K/mean`, `advantage/turn/K/mean|std`, `reward/turn/<part>/mean`).
Per-turn rewards: `VRAG_TURN_REWARDS` (off|retrieval|on, default off) in the trainer's environment.
"""

from __future__ import annotations

import enum
import os
from typing import Any

from .common import is_patched, mark_patched

ESTIMATORS = {"vrag_turn": "turn", "vrag_gigpo": "gigpo"}
TURN_REWARDS_ENV = "VRAG_TURN_REWARDS"
METRICS_KEY = "vrag_credit"
MARK = "__vrag_credit__"


def extended_enum(original: Any) -> Any:
    if all(name in original._value2member_map_ for name in ESTIMATORS):
        return original
    members = {member.name: member.value for member in original}
    members.update({name.upper(): name for name in ESTIMATORS})
    extended = enum.Enum(original.__name__, members, type=str, module=original.__module__)
    extended.__str__ = lambda self: str(self.value)
    return extended


def make_estimator(name: str) -> Any:
    def estimator(token_level_rewards: Any, response_mask: Any, index: Any = None, turn_ids: Any = None,
                  columns: Any = None, **kwargs: Any) -> tuple:
        from ...training.turn_credit import trainer_credit

        advantages, metrics = trainer_credit(ESTIMATORS[name], token_level_rewards, response_mask, index,
                                             turn_ids, columns, os.environ.get(TURN_REWARDS_ENV, "off"))
        estimator.last_metrics = metrics
        return advantages, advantages

    estimator.__name__ = f"compute_{name}_advantage"
    return estimator


def patch_core_algos(module: Any) -> dict:
    """Extend the enum and the map (idempotent)."""
    if hasattr(module, "AdvantageEstimator"):
        module.AdvantageEstimator = extended_enum(module.AdvantageEstimator)
    for name in ESTIMATORS:
        module.ADV_ESTIMATOR_MAP.setdefault(name, make_estimator(name))
    return {}  # the "estimators" key (estimators.py) reports the install; turn ones follow it


def patch_ray_trainer(module: Any) -> dict:
    """The config check, the batch for our estimators, their metrics (idempotent)."""
    import importlib

    core_algos = importlib.import_module(module.__name__.rsplit(".", 1)[0] + ".core_algos")
    patch_core_algos(core_algos)
    if hasattr(module, "AdvantageEstimator"):
        module.AdvantageEstimator = core_algos.AdvantageEstimator
    original = vars(module).get("compute_advantage")
    if original is not None and not getattr(original, MARK, False):
        def compute_advantage(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
            name = str(getattr(adv_estimator, "value", adv_estimator))
            if name not in ESTIMATORS:
                return original(data, adv_estimator, *args, **kwargs)
            columns = {key: data.non_tensor_batch[key] for key in ("turn_page_ids", "ground_truth")
                       if key in data.non_tensor_batch}
            estimator = core_algos.ADV_ESTIMATOR_MAP[name]
            advantages, returns = estimator(data.batch["token_level_rewards"], data.batch["response_mask"],
                                            data.non_tensor_batch["uid"], data.batch.get("turn_ids", None), columns)
            data.batch["advantages"], data.batch["returns"] = advantages, returns
            data.meta_info[METRICS_KEY] = dict(estimator.last_metrics)
            return data

        setattr(compute_advantage, MARK, True)
        module.compute_advantage = compute_advantage
    metrics = vars(module).get("compute_data_metrics")
    if metrics is not None and not getattr(metrics, MARK, False):
        def compute_data_metrics(batch: Any, *args: Any, **kwargs: Any) -> dict:
            found = {k: v for k, v in (batch.meta_info.get(METRICS_KEY) or {}).items() if k != "estimator"}
            return {**metrics(batch, *args, **kwargs), **found}

        setattr(compute_data_metrics, MARK, True)
        if is_patched(metrics):  # the guard's wrapper inside: its patch_once must still see it done
            mark_patched(compute_data_metrics, metrics)
        module.compute_data_metrics = compute_data_metrics
    return {}  # the "guard_metrics" key reports the ray_trainer patch


__all__ = ["ESTIMATORS", "TURN_REWARDS_ENV", "extended_enum", "make_estimator", "patch_core_algos", "patch_ray_trainer"]
