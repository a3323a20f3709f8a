"""Repairs to the engine EasyR1 builds, needed on any device.

EasyR1 builds its `vllm.LLM` with `load_format="dummy"` and later syncs the actor's (Hugging
Face) weights into it. In vLLM >= 0.32 the Qwen VL vision towers normalise pixels on the device
with a `FusedMMInputNorm` whose `weight`/`bias` are persistent buffers computed from the
processor's image mean/std: the dummy loader fills them with random values and no Hugging Face
checkpoint holds them, so after the sync every image is normalised wrongly (measured on the
CPU check: logprobs after retrieved pages off by up to ~1 nat). `restore_input_norms` rebuilds
them from the model config once, on the first rollout call (the engine is awake then; writing
into a sleeping engine's memory is not safe). Older vLLM has no such module: nothing to do.
"""

from __future__ import annotations

from typing import Any, Callable, Optional


def engine_model(engine: Any) -> Any:
    """The model inside a `vllm.LLM`, by the path EasyR1's sharding manager uses."""
    return engine.llm_engine.model_executor.driver_worker.worker.model_runner.model


def restore_input_norms(model: Any, make_norm: Optional[Callable[[], Any]] = None,
                        vllm_config: Any = None) -> int:
    """Copy fresh `FusedMMInputNorm` buffers into every such module of `model`; returns how many."""
    try:
        from vllm.model_executor.layers.fusion.mm_input_norm import FusedMMInputNorm, build_mm_input_norm
    except ImportError:
        return 0
    import torch

    if make_norm is None:
        def make_norm():
            from vllm.config import set_current_vllm_config

            with set_current_vllm_config(vllm_config):  # vLLM builds custom ops only inside one
                return build_mm_input_norm(vllm_config.model_config)

    restored = 0
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, FusedMMInputNorm):
                continue
            fresh = make_norm()
            for name in ("weight", "bias"):
                getattr(module, name).copy_(getattr(fresh, name).to(getattr(module, name).device))
            restored += 1
    return restored


def restore_engine_input_norms(engine: Any) -> int:
    """`restore_input_norms` on a `vllm.LLM` (0 where the layout is not the one EasyR1 uses)."""
    try:
        model = engine_model(engine)
        vllm_config = engine.llm_engine.vllm_config
    except AttributeError:
        return 0
    return restore_input_norms(model, vllm_config=vllm_config)
