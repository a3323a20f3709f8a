"""The agent as EasyR1's rollout: the dispatcher that stands in for `vLLMRollout` in
`verl.workers.fsdp_workers`, and the adapter that turns the agent's output into what EasyR1's
trainer expects.

The adapter, per `generate_sequences` call:
* `response_mask` <- the agent's `loss_mask` (EasyR1 has no separate loss mask; `attention_mask`
  keeps every real response token, observations included, so the actor still attends to them);
* the agent's batch metrics (`meta_info["metrics"]`) are copied into a per-row column
  `vrag_metrics` (every row holds its worker's dict): `DataProto.concat` keeps only the first
  data-parallel chunk's meta_info, a column survives it, and the reward-manager patch turns it
  into reward metrics, which the trainer logs;
* the live guard (`guard.py`), unless `guard: off`, inspects the agent's output first and acts on
  it (`fail` raises, `drop` zeroes a bad sample's masks) and adds the per-row `vrag_guard` column;
* for the trainer's ReMax baseline call, the output is stripped (`estimators.strip_baseline_output`)
  and not guarded (only its rewards are used);
* on the first call, the engine's vision input-norm buffers are restored (`engine_fixes`).

Under a context policy the output holds each episode's rows (closed segments, then its final
row); the trainer patch (`segments.py`) shows EasyR1's batch-making code the final rows only and
puts the rest back after it.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from ...config import AgentRolloutConfig
from .common import AGENT_CLASS_ENV, AGENT_ROLLOUT_NAME, DEFAULT_AGENT_CLASS, METRICS_COLUMN, mark_patched, patch_once
from .estimators import is_remax_baseline, strip_baseline_output


def easyr1_masks(output: Any) -> Any:
    """Put a rollout output's separate `loss_mask` into `response_mask` (see the module docstring)."""
    batch = output.batch
    if batch is None or "loss_mask" not in batch.keys():
        return output
    mask = batch["loss_mask"]
    if "response_mask" in batch.keys():
        mask = mask.to(batch["response_mask"].dtype)
    batch["response_mask"] = mask
    return output


def metrics_column(output: Any) -> Any:
    """Copy `meta_info["metrics"]` into the per-row column `vrag_metrics` (numbers only)."""
    import numpy as np

    metrics = output.meta_info.get("metrics")
    if not metrics or output.batch is None:
        return output
    numbers = {str(k): float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
    column = np.empty(len(output.batch), dtype=object)
    for row in range(len(column)):
        column[row] = numbers
    output.non_tensor_batch[METRICS_COLUMN] = column
    return output


class EasyR1RolloutAdapter:
    """Wraps the agent for EasyR1's worker (see the module docstring); everything else
    (`inference_engine` for the sharding manager, `update_sampling_params`, ...) is delegated."""

    def __init__(self, rollout: Any, live_guard: Any = None):
        engine = getattr(rollout, "inference_engine", None)
        if engine is None:
            raise TypeError(
                f"{type(rollout).__name__} has no `inference_engine`: EasyR1's "
                "FSDPVLLMShardingManager syncs the actor's weights into `rollout.inference_engine`, "
                "which must be a vllm.LLM built with distributed_executor_backend='external_launcher' "
                "and enable_sleep_mode=True"
            )
        self._rollout = rollout
        self._live_guard = live_guard
        self._engine_repaired = False

    def generate_sequences(self, prompts: Any) -> Any:
        if not self._engine_repaired:  # first call: the engine is awake and holds synced weights
            from ...engine.input_norms import restore_engine_input_norms

            restore_engine_input_norms(self._rollout.inference_engine)
            self._engine_repaired = True
        baseline = is_remax_baseline(prompts.meta_info)
        output = self._rollout.generate_sequences(prompts)
        if baseline:
            return strip_baseline_output(easyr1_masks(output))
        if self._live_guard is not None:  # on the agent's own batch, before its masks are merged
            self._live_guard(output)
        return metrics_column(easyr1_masks(output))

    def __getattr__(self, name: str) -> Any:
        if name in ("_rollout", "_live_guard", "_engine_repaired"):  # not set yet (e.g. during copy): avoid recursing
            raise AttributeError(name)
        return getattr(self._rollout, name)


def load_agent_class(path: Optional[str] = None) -> type:
    """`module:Class` from the argument, env `VRAG_AGENT_CLASS`, or `vrag_rollout:vLLMRolloutAgent`."""
    path = path or os.environ.get(AGENT_CLASS_ENV) or DEFAULT_AGENT_CLASS
    module_name, _, attr = path.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr or "vLLMRolloutAgent")
    except (ImportError, AttributeError) as error:
        raise ImportError(f"cannot load the agent rollout class {path!r}: {error}") from error


def _accepts_engine(cls: type) -> bool:
    """Whether `cls(...)` takes `inference_engine`: by name, or through `**kwargs` (a subclass that
    passes its arguments on, `__init__(self, *args, **kwargs)`, must not silently build an engine
    of its own that the sharding manager never syncs)."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False
    return "inference_engine" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def sampled_logprobs_mode() -> str:
    """The vLLM `logprobs_mode` the agent reports (logprobs of the distribution sampled from)."""
    from ...engine.llm import SAMPLED_LOGPROBS_MODE

    return SAMPLED_LOGPROBS_MODE


@contextmanager
def engine_defaults(rollout_cls: Any, **defaults: Any) -> Iterator[None]:
    """While EasyR1's `vLLMRollout` builds its engine, give `vllm.LLM` extra keyword defaults.

    EasyR1 (b44b311) builds `LLM(...)` without `logprobs_mode`, so vLLM reports raw logprobs
    (before temperature); the agent's rollout logprobs must be those of the distribution sampled
    from (`processed_logprobs`), as the actor computes them. The name `LLM` in the rollout
    class's module is wrapped for the duration of the call only; a module without it (another
    rollout) is left alone.
    """
    import sys

    module = sys.modules.get(getattr(rollout_cls, "__module__", ""), None)
    original = getattr(module, "LLM", None) if module is not None else None
    if original is None:
        yield
        return

    def llm(*args: Any, **kwargs: Any) -> Any:
        for key, value in defaults.items():
            kwargs.setdefault(key, value)
        return original(*args, **kwargs)

    module.LLM = llm
    try:
        yield
    finally:
        module.LLM = original


class RolloutDispatcher:
    """Stands in for EasyR1's `vLLMRollout` name inside `verl.workers.fsdp_workers`.

    For the agent, the vLLM engine is still built by EasyR1's own `vLLMRollout` (same
    `external_launcher` backend, sleep mode, dummy weights, LoRA hijack and initial sleep that the
    sharding manager expects), with `limit_images` raised to the images one episode may hold and
    `logprobs_mode="processed_logprobs"` (`engine_defaults`), and handed to the agent as
    `inference_engine`.
    """

    def __init__(self, original: Any):
        self.original = original
        mark_patched(self, original)

    def __call__(self, model_path: str, config: Any, tokenizer: Any, processor: Any = None, **kwargs: Any):
        if getattr(config, "name", None) != AGENT_ROLLOUT_NAME:
            return self.original(model_path=model_path, config=config, tokenizer=tokenizer,
                                 processor=processor, **kwargs)
        if not isinstance(config, AgentRolloutConfig):
            raise TypeError(
                f"worker.rollout.name is {AGENT_ROLLOUT_NAME!r} but the rollout config is a "
                f"{type(config).__name__}, which has no agent fields: start the run with "
                "`python -m vrag_rollout.integrations.easyr1` (or build the config with "
                "load_ppo_config) so worker.rollout uses EasyR1AgentRolloutConfig"
            )
        agent_cls = load_agent_class()
        if kwargs.get("lora_kwargs") and not getattr(agent_cls, "supports_lora", False):
            raise NotImplementedError(
                f"{agent_cls.__name__} does not support LoRA (worker.actor.model.lora.rank > 0): "
                "EasyR1's sharding manager would push adapters into an engine built without them"
            )
        agent_kwargs = dict(kwargs)
        if _accepts_engine(agent_cls):
            images = max(config.limit_images, config.images_per_sample())
            engine_config = dataclasses.replace(config, limit_images=images)
            with engine_defaults(self.original, logprobs_mode=sampled_logprobs_mode()):
                base = self.original(model_path=model_path, config=engine_config, tokenizer=tokenizer,
                                     processor=processor, **kwargs)
            agent_kwargs["inference_engine"] = base.inference_engine
        rollout = agent_cls(model_path=model_path, config=config, tokenizer=tokenizer,
                            processor=processor, **agent_kwargs)
        from .guard import guard_for

        return EasyR1RolloutAdapter(rollout, guard_for(model_path, config, processor))


def patch_fsdp_workers(module: Any, rollout: bool = True, multi_modal_cache: bool = True) -> dict:
    """Install the dispatcher and the per-sample image cache in `verl.workers.fsdp_workers`."""
    from .detect import EasyR1NotAvailable
    from .images import process_multi_modal_inputs_per_sample

    def per_sample_cache(current):
        def patched(self, data, _impl=process_multi_modal_inputs_per_sample):
            return _impl(self, data)

        return mark_patched(patched, current)

    done = {}
    if rollout:
        done["rollout"] = patch_once(module, "vLLMRollout", RolloutDispatcher)
    if multi_modal_cache:
        try:
            done["multi_modal_cache"] = patch_once(module.FSDPWorker, "_process_multi_modal_inputs",
                                                   per_sample_cache)
        except AttributeError as exc:
            raise EasyR1NotAvailable("this EasyR1 has no FSDPWorker._process_multi_modal_inputs") from exc
    return done
