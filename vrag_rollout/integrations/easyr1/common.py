"""Names shared by the EasyR1 integration's modules: the rollout name, environment variables,
the importable module path Ray workers resolve, and how a patch marks what it replaced."""

from __future__ import annotations

import threading
from typing import Any, Callable

AGENT_ROLLOUT_NAME = "vrag_agent"
DEFAULT_AGENT_CLASS = "vrag_rollout:vLLMRolloutAgent"
AGENT_CLASS_ENV = "VRAG_AGENT_CLASS"
GENERATION_KEYS_ENV = "VRAG_GENERATION_KEYS"
DEFAULT_GENERATION_KEYS = ("doc_id", "page_count")
# Set for tool_call runs: EasyR1's dataset renders prompts with the tool schemas (prompt_tools).
PROMPT_TOOLS_ENV = "VRAG_PROMPT_TOOLS"
MODULE = "vrag_rollout.integrations.easyr1"  # also when run as __main__: pickles must name this
SETUP_HOOK = MODULE + ".worker_setup_hook"
CONFIG_CLASS_NAME = "EasyR1AgentRolloutConfig"

# Non-tensor columns and meta keys the integration adds (see the modules that write them).
METRICS_COLUMN = "vrag_metrics"                 # per row: its rollout worker's batch metrics
BASELINE_PAGES_COLUMN = "vrag_baseline_page_ids"  # ReMax baseline: page ids per observation
GENERATION_MARK = "vrag_generation_pop"         # meta of a training generation batch

PATCH_MARK = "__vrag_original__"
lock = threading.RLock()


def mark_patched(new: Any, original: Any) -> Any:
    setattr(new, PATCH_MARK, original)
    return new


def is_patched(obj: Any) -> bool:
    return hasattr(obj, PATCH_MARK)


def patch_once(owner: Any, name: str, make: Callable[[Any], Any]) -> bool:
    """Replace ``owner.<name>`` (its own attribute, never an inherited one) by ``make(current)``,
    which must return a `mark_patched` object, unless an earlier call did already. True when this
    call patched; AttributeError when the owner has no such attribute of its own."""
    current = vars(owner).get(name)
    if current is None:
        raise AttributeError(f"{getattr(owner, '__name__', owner)!s} has no {name} of its own to patch")
    if is_patched(current):
        return False
    setattr(owner, name, make(current))
    return True
