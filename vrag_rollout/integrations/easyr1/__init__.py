"""Run `vrag_rollout.vLLMRolloutAgent` as the rollout of an EasyR1 (hiyouga/EasyR1) training job.

EasyR1 has no rollout registry: `FSDPWorker._build_rollout` always calls the module-global name
`vLLMRollout` of `verl.workers.fsdp_workers`, and its workers are Ray actors, so a patch made in
the driver does not reach them. One module per job:

* `detect`: recognising EasyR1's `verl` by its files (`EasyR1NotAvailable` otherwise);
* `config_schema`: EasyR1's `PPOConfig` with `worker.rollout` typed as a subclass of both
  EasyR1's `RolloutConfig` and `AgentRolloutConfig`; the start-up checks (pixel bands, token
  budget, advantage estimator);
* the patches, each installed inside every Ray worker process:
  - `rollout_adapter`: `verl.workers.fsdp_workers.vLLMRollout` -> a dispatcher that builds the
    agent (wrapped in an adapter: EasyR1's masks, metrics column, ReMax baseline) when
    `worker.rollout.name == "vrag_agent"`, EasyR1's own rollout otherwise;
  - `images`: `FSDPWorker._process_multi_modal_inputs` with an image cache keyed per sample;
  - `generation_pop`: `DataProto.pop` copies `doc_id` into the generation batch;
  - `reward_manager`: `AutoRewardManager.compute_reward` scores the whole response, hands the
    reward function the pages shown, puts the score on the last sampled token, returns the
    agent's metrics;
  - `estimators`: REINFORCE++ returns that skip observation tokens;
  - `turn_estimators`: the turn-level estimators `vrag_turn`, `vrag_gigpo` (EasyR1's enum extended,
    `compute_advantage` handing them the batch's turn columns, their metrics in the step's);
  - `prompt_tools`: `RLHFDataset` renders the prompts of tool_call runs with the tool schemas;
* `hooks`: installing the patches now or on first import (`install_agent_rollout`,
  `worker_setup_hook`);
* `ray_env`: the job's runtime_env (`make_runtime_env`);
* `entry`: `main()`, a drop-in for `python -m verl.trainer.main`.
* `preflight`: what `scripts/train_easyr1.sh` checks before it starts (EasyR1, config, data, index).

Nothing here imports EasyR1 at import time: the PyPI package `verl` (volcengine's) has the same
import name, so EasyR1 is recognised by its file layout and every use fails with a clear
`EasyR1NotAvailable` when it is not installed. This package is the public import path; the names
below are its API.
"""

from __future__ import annotations

import importlib  # noqa: F401  (tests reach importlib.util through this module)
import importlib.util  # noqa: F401
from typing import Any

from . import config_schema
from .common import (
    AGENT_CLASS_ENV,
    AGENT_ROLLOUT_NAME,
    BASELINE_PAGES_COLUMN,
    CONFIG_CLASS_NAME,
    DEFAULT_AGENT_CLASS,
    DEFAULT_GENERATION_KEYS,
    GENERATION_KEYS_ENV,
    GENERATION_MARK,
    METRICS_COLUMN,
    MODULE,
    PROMPT_TOOLS_ENV,
    SETUP_HOOK,
    is_patched,
)
from .config_schema import (
    EASYR1_ROLLOUT_FIELDS,
    REFUSED_ESTIMATORS,
    SUPPORTED_ESTIMATORS,
    check_agent_config,
    check_estimator,
    check_pixel_bands,
    easyr1_rollout_config_class,
    load_ppo_config,
    make_rollout_config_class,
    missing_rollout_fields,
    swap_rollout_schema,
)
from .detect import EASYR1_MARKER_FILES, EasyR1NotAvailable, easyr1_location, require_easyr1
from .entry import main
from .estimators import (
    is_remax_baseline,
    make_reinforce_plus_plus,
    skip_observation_returns,
    strip_baseline_output,
)
from .generation_pop import generation_keys, make_generation_pop
from .hooks import PatchOnImport, install_agent_rollout, worker_setup_hook
from .images import build_multi_modal_inputs, image_fingerprint, sample_cache_keys
from .prompt_tools import give_prompts_tools, patch_dataset, prompt_tools_template
from .ray_env import DEFAULT_RAY_ENV_VARS, make_runtime_env
from .reward_manager import (
    agent_metrics,
    full_response_view,
    make_agent_reward,
    place_on_last_sampled,
    reward_view,
    with_page_ids,
)
from .rollout_adapter import EasyR1RolloutAdapter, RolloutDispatcher, easyr1_masks, load_agent_class, metrics_column

__all__ = [
    "AGENT_CLASS_ENV",
    "AGENT_ROLLOUT_NAME",
    "BASELINE_PAGES_COLUMN",
    "CONFIG_CLASS_NAME",
    "DEFAULT_AGENT_CLASS",
    "DEFAULT_GENERATION_KEYS",
    "DEFAULT_RAY_ENV_VARS",
    "EASYR1_MARKER_FILES",
    "EASYR1_ROLLOUT_FIELDS",
    "EasyR1NotAvailable",
    "EasyR1RolloutAdapter",
    "GENERATION_KEYS_ENV",
    "GENERATION_MARK",
    "METRICS_COLUMN",
    "MODULE",
    "PROMPT_TOOLS_ENV",
    "PatchOnImport",
    "REFUSED_ESTIMATORS",
    "RolloutDispatcher",
    "SETUP_HOOK",
    "SUPPORTED_ESTIMATORS",
    "agent_metrics",
    "build_multi_modal_inputs",
    "check_agent_config",
    "check_estimator",
    "check_pixel_bands",
    "config_schema",
    "easyr1_location",
    "easyr1_masks",
    "easyr1_rollout_config_class",
    "full_response_view",
    "generation_keys",
    "give_prompts_tools",
    "image_fingerprint",
    "install_agent_rollout",
    "is_patched",
    "is_remax_baseline",
    "load_agent_class",
    "load_ppo_config",
    "main",
    "make_agent_reward",
    "make_generation_pop",
    "make_reinforce_plus_plus",
    "make_rollout_config_class",
    "make_runtime_env",
    "metrics_column",
    "missing_rollout_fields",
    "patch_dataset",
    "place_on_last_sampled",
    "prompt_tools_template",
    "require_easyr1",
    "reward_view",
    "sample_cache_keys",
    "skip_observation_returns",
    "strip_baseline_output",
    "swap_rollout_schema",
    "with_page_ids",
    "worker_setup_hook",
]

# Older private names, kept for callers of the single-module version.
_is_patched = is_patched
_PatchOnImport = PatchOnImport


def __getattr__(name: str) -> Any:
    # Lets pickle (Ray ships the config to every worker) find the dynamically built class as
    # `vrag_rollout.integrations.easyr1.EasyR1AgentRolloutConfig`.
    if name == CONFIG_CLASS_NAME:
        return easyr1_rollout_config_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
