"""Multi-turn visual document-retrieval agent rollouts on vLLM for EasyR1-style RL trainers.

Public API: the rollout classes a trainer builds, their config, and a minimal DataProto for
standalone use. vLLM is imported only when an engine is built.
"""

from .config import AgentRolloutConfig
from .protocol import DataProto
from .rollout import BaseRollout, vLLMRollout, vLLMRolloutAgent

__all__ = ["AgentRolloutConfig", "BaseRollout", "DataProto", "vLLMRollout", "vLLMRolloutAgent"]
__version__ = "0.1.0"
