"""A token-in/token-out server over a local vLLM engine, answering as verl's vLLM server does.

verl's agent loops reach their engine through `server_manager.generate(request_id, prompt_ids=,
sampling_params=, image_data=)`. `LocalTokenServer` gives the same call over an `LLM` in this
process (for `scripts/check_verl.py` and the tests, which run verl's worker without Ray or a GPU):

- the SamplingParams are built from the dict with `max_tokens` (default: what the request's
  `max_tokens` says, else `response_length`) and the `logprobs` flag turned into vLLM's 0 (the
  sampled token's own logprob), as verl's `vLLMHttpServer.generate` does;
- each image's run of pads in `prompt_ids` is collapsed to one (verl's
  `qwen2_5_vl_dedup_image_tokens`), the images go in `multi_modal_data`;
- the answer has the fields of verl's `TokenOutput`: `token_ids`, `log_probs` (sampled tokens),
  `stop_reason` ("completed", or "aborted" for an aborted request), `extra_fields`, and
  `num_preempted` / `routed_experts` (None: not reported, as verl's server says for them).

Calls run one at a time (an `LLM` is not re-entrant), each in a worker thread, so the other
trajectories' coroutines go on meanwhile.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence


@dataclass
class TokenAnswer:
    token_ids: list
    log_probs: Optional[list]
    stop_reason: str
    extra_fields: dict = field(default_factory=dict)
    num_preempted: Optional[int] = None  # verl's loops read these two of every answer
    routed_experts: Any = None


def collapse_image_pads(prompt_ids: Sequence[int], image_pad: int) -> list[int]:
    return [t for i, t in enumerate(prompt_ids) if not (t == image_pad and i and prompt_ids[i - 1] == t)]


class LocalTokenServer:
    def __init__(self, llm: Any, image_pad: int, response_length: int):
        self.llm, self.image_pad, self.response_length = llm, image_pad, response_length
        self.calls = 0
        self._lock: Optional[asyncio.Lock] = None

    async def generate(self, request_id: str, *, prompt_ids: Sequence[int], sampling_params: dict,
                       image_data: Optional[list] = None, **kwargs: Any) -> TokenAnswer:
        from vllm import SamplingParams

        params = dict(sampling_params)
        max_tokens = params.pop("max_tokens", self.response_length)
        params["logprobs"] = 0 if params.pop("logprobs", False) else None
        prompt: dict = {"prompt_token_ids": collapse_image_pads(list(prompt_ids), self.image_pad)}
        if image_data:
            prompt["multi_modal_data"] = {"image": list(image_data)}
        if self._lock is None:  # created on the loop that first calls
            self._lock = asyncio.Lock()
        async with self._lock:
            self.calls += 1
            outputs = await asyncio.to_thread(self.llm.generate, [prompt], SamplingParams(max_tokens=max_tokens, **params),
                                              use_tqdm=False)
        done = outputs[0].outputs[0]
        logprobs = [step[t].logprob for step, t in zip(done.logprobs, done.token_ids)] if done.logprobs else None
        return TokenAnswer(list(done.token_ids), logprobs, "aborted" if done.finish_reason == "abort" else "completed")
