"""A scripted stand-in for the engine's sampling, for benchmarks of everything but the model.

`ScriptedSampler.generate(prompts, params)` answers each request as a policy that always fetches
a page would: `<think>` + random words + `</think><fetch>image, k</fetch>`, so a rollout driven by
it runs the agent's own turn loop, retrieval, page decoding, observations and batch assembly at
any scale without a model's cost (scripts/bench_guard.py, scripts/bench_pages.py).
"""

from __future__ import annotations

import functools
from typing import Any


class ScriptedSampler:
    """Stands in for the engine's `generate`: per request, `<think>` + random words
    cut to `thought_tokens` tokens + `</think><fetch>image, k</fetch>`, seeded by the request's
    own seed (samples of one prompt differ), stopped at the fetch's close tag as vLLM's stop
    string stops it, or cut at the request's `max_tokens` (a length stop)."""

    WORDS = ("page", "report", "table", "figure", "total", "region", "margin", "plant", "safety", "level",
             "check", "value", "number", "year", "section", "energy", "device", "manual", "result", "look")

    def __init__(self, tokenizer: Any, thought_tokens: int):
        self.tokenizer, self.thought_tokens = tokenizer, thought_tokens

    def turn(self, seed: int) -> list[int]:
        import random

        draw = random.Random(seed)
        encode = functools.partial(self.tokenizer.encode, add_special_tokens=False)
        words = " ".join(draw.choice(self.WORDS) for _ in range(self.thought_tokens))
        thought = encode(words)[:self.thought_tokens]  # exactly that many tokens, whatever a word takes
        return encode("<think>") + thought + encode(f"</think><fetch>image, {draw.randint(1, 3)}</fetch>")

    def generate(self, prompts: Any, params: Any) -> list:
        from vrag_rollout.turn_output import LENGTH, STOP, TurnOutput

        outputs = []
        for param in params:
            ids = self.turn(param.seed)
            cut = len(ids) > param.max_tokens
            ids = ids[:param.max_tokens]
            outputs.append(TurnOutput(
                token_ids=tuple(ids), text=self.tokenizer.decode(ids), finish_reason=LENGTH if cut else STOP,
                stop_reason=None if cut else "</fetch>",
                logprobs=tuple(-1.0 for _ in ids) if param.logprobs is not None else None))
        return outputs
