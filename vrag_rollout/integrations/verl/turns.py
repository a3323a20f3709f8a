"""What verl's server returns for one turn, as the rollout's `TurnOutput` (pure).

verl's `generate` answers token ids, their logprobs and a coarse `stop_reason` ("completed" for
a stop string, an EOS and the length limit alike; "aborted"), no text. The per-turn step needs
what vLLM itself reports, so it is recovered from the tokens, with vLLM's own precedence:

- a stop string in the decoded text: finish "stop", `stop_reason` that string, the text cut
  after its first occurrence (what vLLM's detokenizer returns with `include_stop_str_in_output`);
- else a last token that is an end-of-sequence id: "stop", `stop_reason` None;
- else `max_tokens` tokens: "length";
- else (an aborted or cut-short request): "abort".
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from ...engine.llm import TurnOutput

ABORTED = "aborted"  # verl's stop_reason for a request the server aborted


def turn_output(token_ids: Sequence[int], log_probs: Optional[Sequence[float]], *, stop_reason: Optional[str],
                max_tokens: int, stop_strings: Sequence[str], eos_ids: Sequence[int],
                decode: Callable[[list[int]], str]) -> TurnOutput:
    ids = tuple(int(t) for t in token_ids)
    logprobs = tuple(float(x) for x in log_probs) if log_probs is not None else None
    text = decode(list(ids))
    hits = [(text.find(stop) + len(stop), stop) for stop in stop_strings if stop in text]
    if hits:
        end, stop = min(hits)
        return TurnOutput(ids, text[:end], "stop", stop, logprobs)
    if ids and ids[-1] in eos_ids:
        return TurnOutput(ids, text, "stop", None, logprobs)
    if stop_reason != ABORTED and len(ids) >= max_tokens:
        return TurnOutput(ids, text, "length", None, logprobs)
    return TurnOutput(ids, text, "abort", None, logprobs)
