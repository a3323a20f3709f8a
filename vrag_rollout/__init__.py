"""Multi-turn visual document-retrieval agent rollouts on vLLM for EasyR1-style RL trainers.

Public API: the rollout classes a trainer builds, their config, a minimal DataProto, and the
prompt batch builder for standalone use (`PromptSample`, `build_prompts`). vLLM is imported only
when an engine is built.
"""

from .config import AgentRolloutConfig
from .data.prompts import PromptSample, build_prompts
from .protocol import DataProto
from .rollout import BaseRollout, vLLMRollout, vLLMRolloutAgent

__all__ = ["AgentRolloutConfig", "BaseRollout", "DataProto", "PromptSample", "build_prompts", "vLLMRollout",
           "vLLMRolloutAgent"]
__version__ = "0.1.0"
