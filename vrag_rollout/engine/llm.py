"""The vLLM engine: building it as a trainer does, and the two ways the schedules drive it
(`VLLMEngine`: one `LLM.generate` per turn; `ContinuousEngine`: requests added and stepped one
by one). `engine/` is the only layer that imports vllm (tests/test_layers.py checks it)."""

from __future__ import annotations

import itertools
import logging
import os
import sys
import warnings
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

from ..turn_output import ABORT, TurnOutput


# Start-up warnings that say nothing on a machine without a GPU, as (logger, message start): vLLM
# disables Triton there anyway (it warns at import, before its own log level applies), and no
# CUDA extension is built, so torch's guess of a CUDA_HOME is never used.
CPU_START_UP_NOISE = (
    ("vllm.triton_utils.importing", "Triton is installed, but doesn't include CPU backend"),
    ("torch.utils.cpp_extension", "No CUDA runtime is found"),
)


@dataclass(frozen=True)
class _DropMessage:
    """A logging filter dropping the records whose message starts with `start`; equal filters
    are one (`Logger.addFilter` adds a filter once), so configuring again adds nothing."""

    start: str

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def configure_cpu_defaults() -> None:
    """Environment defaults that let vLLM run in-process on a machine without a GPU, and quiet
    its start-up warnings that only concern GPUs (`CPU_START_UP_NOISE`).

    Only sets variables the user has not set, and only when no CUDA device is visible. Call it
    before vLLM is imported: the Triton warning is logged at import.
    """
    try:
        import torch

        if torch.cuda.is_available():
            return
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", _unbound_threads_value())
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    for name, start in CPU_START_UP_NOISE:
        logging.getLogger(name).addFilter(_DropMessage(start))


def _unbound_threads_value() -> str:
    """The VLLM_CPU_OMP_THREADS_BIND value that leaves OpenMP threads unbound: "nobind" since
    vLLM 0.11.1; "all" before (which later vLLM takes for a CPU list, and 0.11.0 "nobind": both
    crash the CPU worker). Read from the installed distribution, without importing vLLM."""
    import re
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            release = tuple(int(part) for part in re.findall(r"\d+", version(dist).split("+")[0])[:3])
        except PackageNotFoundError:
            continue
        return "all" if release < (0, 11, 1) else "nobind"
    return "nobind"


def sleep_mode_available() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_sleep_mode_available())
    except Exception:  # noqa: BLE001 - any failure means "do not try"
        return False


_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

# Logprobs of the distribution actually sampled from (after the logit bias that bans vision tokens
# and the temperature): what the actor's temperature-scaled logprobs are compared with.
SAMPLED_LOGPROBS_MODE = "processed_logprobs"


def engine_limits(llm: Any) -> tuple[Optional[int], Optional[str]]:
    """(max_model_len, logprobs_mode) of a `vllm.LLM`; None for what an engine does not expose."""
    model_config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
    max_len = getattr(model_config, "max_model_len", None)
    mode = getattr(model_config, "logprobs_mode", None)
    return (int(max_len) if isinstance(max_len, int) else None), (str(mode) if isinstance(mode, str) else None)


def check_engine_limits(config: Any, llm: Any) -> Optional[str]:
    """Refuse, before any rollout, what the engine would reject mid-batch or report wrongly;
    returns the engine's logprobs mode."""
    max_len, mode = engine_limits(llm)
    budget = config.prompt_length + config.response_length
    if max_len is not None and max_len < budget:
        raise ValueError(
            f"the engine's max_model_len {max_len} < prompt_length + response_length = {budget}: vLLM would "
            "reject a long episode mid-batch and lose the batch; raise max_model_len or lower the lengths"
        )
    if config.calculate_log_probs and mode not in (None, SAMPLED_LOGPROBS_MODE) and config.temperature != 1.0:
        raise ValueError(
            f"calculate_log_probs at temperature {config.temperature} needs an engine built with "
            f"logprobs_mode={SAMPLED_LOGPROBS_MODE!r} (this one reports {mode!r}: logprobs before temperature, "
            "which disagree with the actor's)"
        )
    return mode


def _breaks_kernel_scan(value: Any) -> bool:
    try:
        return hasattr(value, "__dict__") and not callable(getattr(vars(value), "get", None))
    except Exception:  # noqa: BLE001 - anything odd here would break the scan too
        return True


@contextmanager
def _modules_hidden_from_kernel_scan() -> Iterator[None]:
    """Hide modules whose globals break vLLM's CPU kernel-override scan while an engine starts.

    On CPU, vLLM walks every module in `sys.modules` and reads `vars(value)` of each global. An
    object whose `__dict__` is not a dict (llvmlite's `ffi.lib`, loaded by numba, which bm25s
    imports) makes it fail with "'_lib_fn_wrapper' object has no attribute 'get'", so an
    engine cannot start in a process that has imported the retriever server.
    """
    hidden = {}
    with warnings.catch_warnings():
        # Reading every global touches torch's deprecated `torch.distributed.reduce_op`, whose
        # FutureWarning says nothing to a user; vLLM's own scan (inside the `yield`) does too.
        warnings.filterwarnings("ignore", message=r".*torch\.distributed\.reduce_op", category=FutureWarning)
        for name, module in list(sys.modules.items()):
            namespace = getattr(module, "__dict__", None)
            if namespace and any(_breaks_kernel_scan(value) for value in list(namespace.values())):
                hidden[name] = module
        for name in hidden:
            del sys.modules[name]
        try:
            yield
        finally:
            sys.modules.update(hidden)


def create_llm(**llm_kwargs: Any) -> Any:
    """`vllm.LLM(**llm_kwargs)`, startable on CPU whatever else the process has imported."""
    from ..progress import report

    report("starting vLLM with %s (about half a minute on a CPU, seconds on a GPU)", llm_kwargs.get("model"))
    configure_cpu_defaults()
    from vllm import LLM
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        # A prefill split across engine steps makes vLLM rewind the request's seeded generator,
        # which CPU generators cannot do ("CPU Generator does not use offset"); every rollout
        # request is seeded, so keep prefills whole on CPU.
        llm_kwargs.setdefault("enable_chunked_prefill", False)
        # The CPU worker sizes its KV cache from VLLM_CPU_KVCACHE_SPACE, not from a profile: a
        # multimodal profiling pass would only cost start-up time.
        llm_kwargs.setdefault("skip_mm_profiling", True)
        with _modules_hidden_from_kernel_scan(), _explicit_kv_cache_wins(llm_kwargs):
            return LLM(**llm_kwargs)
    return LLM(**llm_kwargs)


@contextmanager
def _explicit_kv_cache_wins(llm_kwargs: dict) -> Iterator[None]:
    """vLLM's CPU platform sizes the KV cache from VLLM_CPU_KVCACHE_SPACE (whole GiB) over an
    explicit `kv_cache_memory_bytes`; with the latter given, the variable is unset while the
    engine starts. (A child process started meanwhile gets the default back from
    `configure_cpu_defaults`.)"""
    if llm_kwargs.get("kv_cache_memory_bytes") is None or "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
        yield
        return
    saved = os.environ.pop("VLLM_CPU_KVCACHE_SPACE")
    try:
        yield
    finally:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = saved


def greedy_texts(llm: Any, prompts: Sequence[str], max_tokens: int) -> list[str]:
    """Each text prompt's greedy completion (a judge's verdict: text in, text out, no images)."""
    from vllm import SamplingParams

    outputs = llm.generate(list(prompts), SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    return [output.outputs[0].text for output in outputs]


def build_llm(model_path: str, config: Any, max_images: int) -> Any:
    """A `vllm.LLM` built as EasyR1 builds its rollout engine, minus what the platform lacks."""
    configure_cpu_defaults()
    max_model_len = config.max_model_len or (config.prompt_length + config.response_length)
    kwargs = dict(
        model=model_path,
        skip_tokenizer_init=False,
        trust_remote_code=config.trust_remote_code,
        load_format=config.load_format,
        dtype=_DTYPES.get(config.dtype, config.dtype),
        seed=config.seed if config.seed is not None else 0,
        max_model_len=max_model_len,
        max_num_batched_tokens=max(config.max_num_batched_tokens, max_model_len),
        enforce_eager=config.enforce_eager,
        enable_chunked_prefill=config.enable_chunked_prefill,
        disable_log_stats=True,
        limit_mm_per_prompt={"image": max_images, "video": 0},
        logprobs_mode=SAMPLED_LOGPROBS_MODE,
    )
    from vllm.platforms import current_platform

    if current_platform.is_cuda_alike():
        kwargs.update(
            tensor_parallel_size=config.tensor_parallel_size,
            gpu_memory_utilization=config.gpu_memory_utilization,
            distributed_executor_backend="external_launcher" if config.tensor_parallel_size > 1 else None,
        )
    if config.enable_sleep_mode and sleep_mode_available():
        kwargs["enable_sleep_mode"] = True
    return create_llm(**kwargs)


class VLLMEngine:
    """Turn-synchronized generation: one `LLM.generate` call for every active sample."""

    def __init__(self, llm: Any):
        self.llm = llm

    def generate(self, prompts: Sequence[dict], params: Sequence[Any]) -> list[TurnOutput]:
        if not prompts:
            return []
        # `LLM.generate` returns every request that finishes in the engine, not only its own:
        # a leftover of a failed call would be paired with one of these samples.
        engine = self.llm.llm_engine
        abort_leftovers(engine)
        if engine.has_unfinished_requests():
            raise RuntimeError("the engine holds requests this rollout did not add; finish or abort them "
                               "before a rollout (their outputs would be taken for the rollout's)")
        outputs = self.llm.generate(list(prompts), list(params), use_tqdm=False)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"the engine returned {len(outputs)} outputs for {len(prompts)} requests")
        return [_turn_output(out.outputs[0]) for out in outputs]


# Numbers the ContinuousEngine runs of this process: part of every request id, so ids never repeat
# across rollout calls, failed ones and other rollouts on the same engine included. Ranks of a
# tensor-parallel group run the same calls in lockstep, so they number them alike.
_RUNS = itertools.count()
# Per vLLM engine, the requests a ContinuousEngine added that have neither finished nor been
# aborted. Only a run that failed and whose abort failed too leaves some; the next run or
# generate call on that engine aborts them before adding its own.
_OPEN: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()


def _open_requests(engine: Any) -> set[str]:
    return _OPEN.setdefault(engine, set())


def abort_leftovers(engine: Any) -> int:
    """Abort the requests earlier runs left in `engine`; how many there were."""
    leftovers = _open_requests(engine)
    count = len(leftovers)
    if leftovers:
        engine.abort_request(sorted(leftovers))
        leftovers.clear()
    return count


class ContinuousEngine:
    """Requests added and finished one by one (`add_request`/`step`): a sample's next turn can
    start while others are still generating. One instance per rollout call, used by the
    schedule's loop thread only. It starts by aborting what earlier runs left in the engine."""

    def __init__(self, llm: Any):
        self._engine = llm.llm_engine
        self._owners: dict[str, Any] = {}
        self._run = next(_RUNS)
        abort_leftovers(self._engine)
        self._open = _open_requests(self._engine)

    @property
    def busy(self) -> bool:
        return bool(self._owners)

    def submit(self, name: str, prompt: dict, params: Any, owner: Any) -> None:
        """Add a request named `name` (unique within this run) on behalf of `owner`."""
        from vllm.sampling_params import RequestOutputKind

        # Only finished requests are read. The default (cumulative) kind makes every step build
        # an output, with all tokens and logprobs so far, for every running request: quadratic
        # work in the turn's length that `LLM.generate` (the synchronized schedule) never does.
        params.output_kind = RequestOutputKind.FINAL_ONLY
        request_id = f"vrag-{self._run}-{name}"
        if request_id in self._owners:
            raise ValueError(f"request {request_id!r} is already in the engine")
        self._open.add(request_id)
        self._engine.add_request(request_id, prompt, params)
        self._owners[request_id] = owner

    def abort_all(self) -> None:
        """Abort every request of this run still in the engine (on an error: none may outlive
        the call; should the abort itself fail, the next run aborts them)."""
        if self._owners:
            ids = list(self._owners)
            self._owners.clear()
            self._engine.abort_request(ids)
            self._open.difference_update(ids)

    def step(self) -> list[tuple[Any, TurnOutput]]:
        """One engine step; (owner, output) of every request of this run that finished in it.
        An output of a request this run did not add is never taken for one of ours."""
        finished = []
        for result in self._engine.step():
            if result.finished and result.request_id in self._owners:
                self._open.discard(result.request_id)
                finished.append((self._owners.pop(result.request_id), _turn_output(result.outputs[0])))
        return finished


def _turn_output(completion: Any) -> TurnOutput:
    logprobs = None
    if completion.logprobs is not None:
        logprobs = tuple(
            float(step[token].logprob) for step, token in zip(completion.logprobs, completion.token_ids)
        )
    return TurnOutput(
        token_ids=tuple(completion.token_ids),
        text=completion.text,
        finish_reason=completion.finish_reason or ABORT,
        stop_reason=completion.stop_reason,
        logprobs=logprobs,
    )
