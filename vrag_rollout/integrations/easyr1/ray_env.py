"""The Ray job environment of an agent run: EasyR1's usual variables, the generation columns and
agent class for the workers, the prompt tools of a tool_call run, and the
`worker_process_setup_hook` that patches every worker."""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from ...formats import format_named
from .common import AGENT_CLASS_ENV, GENERATION_KEYS_ENV, PROMPT_TOOLS_ENV, SETUP_HOOK
from .turn_estimators import TURN_REWARDS_ENV

# Environment EasyR1's own `main()` gives its Ray job (same intent, our own list).
DEFAULT_RAY_ENV_VARS = {
    "TOKENIZERS_PARALLELISM": "true",
    "NCCL_DEBUG": "WARN",
    "VLLM_LOGGING_LEVEL": "WARN",
    "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
}


def make_runtime_env(ppo_config: Any = None, env_vars: Optional[dict] = None) -> dict:
    """A job-level Ray runtime_env that installs the patches in every worker process."""
    merged = dict(DEFAULT_RAY_ENV_VARS)
    if ppo_config is not None:
        rollout = ppo_config.worker.rollout
        keys = [getattr(rollout, "doc_id_key", None), getattr(rollout, "page_count_key", None)]
        if keys[0]:
            merged[GENERATION_KEYS_ENV] = ",".join(key for key in keys if key)
        if format_named(getattr(rollout, "action_format", "tags")).renders_tools:
            template = getattr(ppo_config.worker.rollout, "chat_template", None)
            # Ray actors may run elsewhere in the file system: the path must not be relative.
            merged[PROMPT_TOOLS_ENV] = json.dumps({"chat_template": os.path.abspath(template) if template else None,
                                                   "region_action": bool(getattr(rollout, "region_action", False))})
    # The prompt-tools setting follows the config when there is one: never inherited, so a tags
    # run started after a tool_call run in the same process gets no tool schemas.
    # (the per-turn rewards' switch too: the trainer's estimator reads it in its Ray actor)
    inherited = (AGENT_CLASS_ENV, GENERATION_KEYS_ENV, TURN_REWARDS_ENV) if ppo_config is not None else (
        AGENT_CLASS_ENV, GENERATION_KEYS_ENV, PROMPT_TOOLS_ENV, TURN_REWARDS_ENV)
    for name in inherited:
        if name in os.environ and name not in merged:
            merged[name] = os.environ[name]
    merged.update(env_vars or {})
    return {"env_vars": merged, "worker_process_setup_hook": SETUP_HOOK}
