"""What verl's server returns for one turn, as the rollout's `TurnOutput` (pure).

verl's `generate` answers token ids, their logprobs and a coarse `stop_reason` ("completed" for
a stop string, an EOS and the length limit alike; "aborted"), no text. The per-turn step needs
what vLLM itself reports, so it is recovered from the tokens, with vLLM's own precedence:

- a stop string in the decoded text: finish "stop", `stop_reason` that string, the token ids and
  logprobs cut after the token during which it completes and the text after its end (what vLLM
  returns with `include_stop_str_in_output` for a request it was not asked to interrupt);
- else a last token that is an end-of-sequence id: "stop", `stop_reason` None;
- else `max_tokens` tokens: "length";
- else (an aborted or cut-short request): "abort".

Why the tokens are cut, not only the text: verl's partial rollouts (`FullyAsyncLLMServerClient`)
resubmit an aborted request as prompt + the tokens so far and merge the answers. vLLM looks for
stop strings only in a request's own output, so a stop string split by the abort (`…2</` then
`fetch> more…<|im_end|>`) stops nothing, and the merged answer runs on past it, maybe to an EOS.
The uninterrupted request would have ended at the stop: so does the recovered turn.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from ...turn_output import ABORT, LENGTH, STOP, TurnOutput

ABORTED = "aborted"  # verl's stop_reason for a request the server aborted


def turn_output(token_ids: Sequence[int], log_probs: Optional[Sequence[float]], *, stop_reason: Optional[str],
                max_tokens: int, stop_strings: Sequence[str], eos_ids: Sequence[int],
                decode: Callable[[list[int]], str]) -> TurnOutput:
    ids = tuple(int(t) for t in token_ids)
    logprobs = tuple(float(x) for x in log_probs) if log_probs is not None else None
    text = decode(list(ids))
    if first_stop(text, stop_strings) is not None:
        kept = stop_token_count(ids, stop_strings, decode)
        ids, logprobs = ids[:kept], logprobs[:kept] if logprobs is not None else None
        text = decode(list(ids))
        end, stop = first_stop(text, stop_strings)
        return TurnOutput(ids, text[:end], STOP, stop, logprobs)
    if ids and ids[-1] in eos_ids:
        return TurnOutput(ids, text, STOP, None, logprobs)
    if stop_reason != ABORTED and len(ids) >= max_tokens:
        return TurnOutput(ids, text, LENGTH, None, logprobs)
    return TurnOutput(ids, text, ABORT, None, logprobs)


def first_stop(text: str, stop_strings: Sequence[str]) -> Optional[tuple[int, str]]:
    """(end of the stop string that ends first in `text`, that string), or None."""
    hits = [(text.find(stop) + len(stop), stop) for stop in stop_strings if stop and stop in text]
    return min(hits) if hits else None


def stop_token_count(ids: Sequence[int], stop_strings: Sequence[str], decode: Callable[[list[int]], str]) -> int:
    """How many tokens vLLM keeps of `ids` whose text holds a stop string: up to and including
    the token during which the first stop string completes.

    A binary search over prefix lengths, O(log n) decodes: once a prefix's text holds a stop
    string every longer prefix's does (the text only grows at its end; a stop string is never
    a replacement character of an unfinished byte sequence).
    """
    lo, hi = 0, len(ids)  # the text of ids[:lo] holds no stop string, that of ids[:hi] holds one
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if first_stop(decode(list(ids[:mid])), stop_strings) is None:
            lo = mid
        else:
            hi = mid
    return hi
