"""What one generation turn returns, whoever generated it (a leaf every layer may use).

`TurnOutput` is the engine's answer for one turn of one sample: vLLM's in-process engine
(`engine/llm.py`), verl's token server (`integrations/verl/turns.py`) and test stand-ins all
produce it, and the pure per-turn step (`core/step.py`, `core/actions.py`) reads it. Its
`finish_reason` is one of `FINISH_REASONS`, vLLM's names: "stop" (a stop string or an EOS
token ended the turn; `stop_reason` says which, None for the tokenizer's own EOS), "length"
(the turn's token budget ran out) or "abort" (the request was cancelled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

STOP, LENGTH, ABORT = "stop", "length", "abort"
FINISH_REASONS = (STOP, LENGTH, ABORT)


@dataclass(frozen=True)
class TurnOutput:
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str  # one of FINISH_REASONS
    stop_reason: object  # a stop string, an EOS token id, or None (the tokenizer's EOS)
    logprobs: Optional[tuple[float, ...]] = None


__all__ = ["ABORT", "FINISH_REASONS", "LENGTH", "STOP", "TurnOutput"]
