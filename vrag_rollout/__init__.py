"""Multi-turn visual document-retrieval agent rollouts on vLLM for EasyR1-style RL trainers.

Public API: the rollout classes a trainer builds, their config, a minimal DataProto, and the
prompt batch builder for standalone use (`PromptSample`, `build_prompts`). Each name is imported
on first use (torch, tensordict and vLLM load only then), so `vrag-rollout --help` and the
light subcommands start at once.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_PUBLIC = {
    "AgentRolloutConfig": ".config",
    "PromptSample": ".data.prompts",
    "build_prompts": ".data.prompts",
    "DataProto": ".protocol",
    "BaseRollout": ".rollout",
    "vLLMRollout": ".rollout",
    "vLLMRolloutAgent": ".rollout",
}

__all__ = sorted(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_PUBLIC[name], __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
