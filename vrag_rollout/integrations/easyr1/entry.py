"""`python -m vrag_rollout.integrations.easyr1 config=<yaml> [k=v ...]`: a drop-in for
`python -m verl.trainer.main` that loads the agent schema, checks it, starts Ray with the
patching runtime_env and runs EasyR1's own `Runner`."""

from __future__ import annotations

import os
import warnings
from typing import Optional, Sequence

from .common import AGENT_CLASS_ENV, AGENT_ROLLOUT_NAME, GENERATION_KEYS_ENV, PROMPT_TOOLS_ENV, SETUP_HOOK
from .config_schema import load_ppo_config
from .detect import require_easyr1
from .ray_env import make_runtime_env


def main(argv: Optional[Sequence[str]] = None) -> None:
    """`python -m vrag_rollout.integrations.easyr1 config=examples/easyr1_vrag.yaml [k=v ...]`."""
    require_easyr1()
    import ray

    ppo_config = load_ppo_config(argv)
    if getattr(ppo_config.worker.rollout, "name", None) != AGENT_ROLLOUT_NAME:
        warnings.warn(f"worker.rollout.name is not {AGENT_ROLLOUT_NAME!r}: EasyR1's own rollout will run")
    runtime_env = make_runtime_env(ppo_config)
    os.environ.update({k: v for k, v in runtime_env["env_vars"].items() if k in (AGENT_CLASS_ENV, GENERATION_KEYS_ENV, PROMPT_TOOLS_ENV)})
    if PROMPT_TOOLS_ENV not in runtime_env["env_vars"]:
        os.environ.pop(PROMPT_TOOLS_ENV, None)  # Ray's processes inherit this one's environment
    if ray.is_initialized():
        warnings.warn("Ray was initialised before main(): make sure its runtime_env has "
                      f"worker_process_setup_hook={SETUP_HOOK!r}, or workers run EasyR1's rollout")
    else:
        ray.init(runtime_env=runtime_env)
    from verl.trainer.main import Runner

    runner = Runner.remote()
    ray.get(runner.run.remote(ppo_config))
