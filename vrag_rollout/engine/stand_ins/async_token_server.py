"""A token-in/token-out server over vLLM's async engine (`AsyncLLM`), answering as verl's vLLM
server does, with every trajectory's request continuously batched by the engine.

`LocalTokenServer` (token_server.py) runs one `LLM.generate` at a time; verl's real server
(`vLLMHttpServer`) hands each agent loop's request to an `AsyncLLM` whose engine core batches
whatever is in flight step by step. `AsyncTokenServer` does the same in this process (the engine
core runs in vLLM's own background process, as in verl), with the same call and answer:

    await server.generate(request_id, prompt_ids=[...], sampling_params={...}, image_data=[PIL, ...])
    -> TokenAnswer(token_ids, log_probs, stop_reason "completed" | "aborted", extra_fields,
                   num_preempted, routed_experts)

- the SamplingParams are built from the dict as verl's server builds them: `max_tokens` from the
  request, else verl's default `min(response_length, prompt_length + response_length -
  len(prompt_ids))` (without `prompt_length`: `response_length`), clamped to what the context
  leaves; `logprobs` True becomes vLLM's 0 (the sampled token's own); a `structured_outputs` dict
  (what a JSON request carries) becomes vLLM's `StructuredOutputsParams`;
- `banned_token_ids` (optional) are masked for every request, as verl's server masks the vision
  placeholders (there through the model's OOV tail, here as a -100 logit bias merged into the
  request's own);
- each image's run of pads is collapsed to one (verl's `qwen2_5_vl_dedup_image_tokens`), the
  images go in `multi_modal_data`; each call is one vLLM request with a fresh id (verl keeps
  `request_id` for sticky routing only).

`build(model_path, config, max_images, ...)` starts the engine with exactly the engine arguments
`engine.llm.build_llm` gives `vllm.LLM` for that config (taken from it, not restated), on CPU
with the same precautions as `create_llm` (no chunked prefill; modules that break vLLM's CPU
kernel scan hidden while the engine starts).

Measured (for benchmarks): `calls`, `engine_seconds` (wall time inside `generate`, summed over
calls), `max_in_flight`, and `frontend_cpu_s`: CPU seconds this process spends in vLLM's
frontend (input processing, multimodal processor included, and output processing), read with
per-thread CPU clocks around those two functions; None when this vLLM does not expose them.
`engine_core_pids()` are the engine core processes (their CPU is not this process's).

The server must be used from one event loop (vLLM's output handler lives on the first loop that
calls); `shutdown()` stops the engine core.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Optional, Sequence

from .token_server import TokenAnswer, collapse_image_pads

BANNED_LOGIT_BIAS = -100.0


def llm_engine_kwargs(model_path: str, config: Any, max_images: int) -> dict:
    """The keyword arguments `build_llm(model_path, config, max_images)` passes to `create_llm`:
    read from build_llm itself, so the async engine gets exactly the synchronous one's."""
    from .. import llm

    captured: dict = {}
    original = llm.create_llm
    llm.create_llm = lambda **kwargs: captured.update(kwargs)
    try:
        llm.build_llm(model_path, config, max_images)
    finally:
        llm.create_llm = original
    return captured


def create_async_engine(**llm_kwargs: Any) -> Any:
    """`AsyncLLM` from the same keyword arguments `create_llm` takes (vLLM's engine arguments)."""
    from ..llm import _modules_hidden_from_kernel_scan, configure_cpu_defaults

    configure_cpu_defaults()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform
    from vllm.v1.engine.async_llm import AsyncLLM

    if current_platform.is_cpu():
        # As create_llm: a prefill split across steps cannot rewind a seeded CPU generator.
        llm_kwargs.setdefault("enable_chunked_prefill", False)
        with _modules_hidden_from_kernel_scan():
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**llm_kwargs))
    return AsyncLLM.from_engine_args(AsyncEngineArgs(**llm_kwargs))


class AsyncTokenServer:
    def __init__(self, engine: Any, image_pad: int, response_length: int, prompt_length: Optional[int] = None,
                 banned_token_ids: Sequence[int] = ()):
        self.engine, self.image_pad = engine, image_pad
        self.response_length, self.prompt_length = response_length, prompt_length
        self.banned = tuple(int(t) for t in banned_token_ids)
        model_config = getattr(engine, "model_config", None)
        self.max_model_len = int(getattr(model_config, "max_model_len", 0) or 0) or None
        self.calls = 0
        self.engine_seconds = 0.0
        self.in_flight = 0
        self.max_in_flight = 0
        self._cpu_lock = threading.Lock()
        self._frontend_cpu = 0.0
        self._timed = self._instrument_frontend()

    @classmethod
    def build(cls, model_path: str, config: Any, max_images: int, *, image_pad: int,
              banned_token_ids: Sequence[int] = (), verl_default_max_tokens: bool = True) -> "AsyncTokenServer":
        """The engine `build_llm` would build for `config`, as an async server; `max_tokens`
        defaults as verl's server's do (with `config.prompt_length`) unless told otherwise."""
        engine = create_async_engine(**llm_engine_kwargs(model_path, config, max_images))
        return cls(engine, image_pad, int(config.response_length),
                   int(config.prompt_length) if verl_default_max_tokens else None, banned_token_ids)

    # ---- measuring ----
    @property
    def frontend_cpu_s(self) -> Optional[float]:
        if not self._timed:
            return None
        with self._cpu_lock:
            return self._frontend_cpu

    def engine_core_pids(self) -> list[int]:
        """Processes the engine core runs in (children of this one started by vLLM)."""
        try:
            import psutil

            return [child.pid for child in psutil.Process().children(recursive=True)]
        except Exception:  # noqa: BLE001 - measurement only
            return []

    def _timed_call(self, function: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                spent = time.thread_time() - started
                with self._cpu_lock:
                    self._frontend_cpu += spent
        return timed

    def _instrument_frontend(self) -> bool:
        inputs = getattr(self.engine, "input_processor", None)
        outputs = getattr(self.engine, "output_processor", None)
        executor = getattr(getattr(self.engine, "renderer", None), "_executor", None)
        if not (inputs is not None and outputs is not None and hasattr(inputs, "process_inputs")
                and hasattr(inputs, "process_inputs_async") and hasattr(outputs, "process_outputs")):
            return False
        from vllm.utils.async_utils import make_async

        inputs.process_inputs = self._timed_call(inputs.process_inputs)
        inputs.process_inputs_async = make_async(inputs.process_inputs, executor=executor)
        outputs.process_outputs = self._timed_call(outputs.process_outputs)
        return True

    # ---- serving ----
    def _sampling_params(self, sampling_params: dict, prompt_len: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        params = dict(sampling_params)
        room = (self.max_model_len - prompt_len) if self.max_model_len else None
        if room is not None and room < 1:
            raise ValueError(f"prompt of {prompt_len} tokens leaves no room within max_model_len {self.max_model_len}")
        if "max_tokens" in params:
            max_tokens = params.pop("max_tokens")
        elif self.prompt_length is not None:
            max_tokens = min(self.response_length, self.prompt_length + self.response_length - prompt_len)
        else:
            max_tokens = self.response_length
        max_tokens = max(1, min(int(max_tokens), room) if room is not None else int(max_tokens))
        params["logprobs"] = 0 if params.pop("logprobs", False) else None
        if isinstance(params.get("structured_outputs"), dict):
            params["structured_outputs"] = StructuredOutputsParams(**params["structured_outputs"])
        if self.banned:
            bias = dict(params.get("logit_bias") or {})
            for token in self.banned:
                bias.setdefault(token, BANNED_LOGIT_BIAS)
            params["logit_bias"] = bias
        return SamplingParams(max_tokens=max_tokens, **params)

    async def generate(self, request_id: str, *, prompt_ids: Sequence[int], sampling_params: dict,
                       image_data: Optional[list] = None, **kwargs: Any) -> TokenAnswer:
        ids = collapse_image_pads(list(prompt_ids), self.image_pad)
        params = self._sampling_params(sampling_params, len(ids))
        prompt: dict = {"prompt_token_ids": ids}
        if image_data:
            prompt["multi_modal_data"] = {"image": list(image_data)}
        if kwargs.get("mm_processor_kwargs"):
            prompt["mm_processor_kwargs"] = dict(kwargs["mm_processor_kwargs"])
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        started = time.perf_counter()
        final = None
        try:
            async for output in self.engine.generate(prompt, params, uuid.uuid4().hex):
                final = output
        finally:
            self.in_flight -= 1
            self.engine_seconds += time.perf_counter() - started
        if final is None or not final.outputs:
            return TokenAnswer([], None, "aborted")
        done = final.outputs[0]
        logprobs = [step[t].logprob for step, t in zip(done.logprobs, done.token_ids)] if done.logprobs else None
        return TokenAnswer(list(done.token_ids), logprobs,
                           "aborted" if done.finish_reason == "abort" else "completed",
                           {"num_cached_tokens": getattr(final, "num_cached_tokens", None)},
                           num_preempted=getattr(done, "num_preempted", None))

    def shutdown(self) -> None:
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:
            shutdown()
