"""Syncing a trainer's (Hugging Face) weights into the running vLLM engine, and proving it worked.

Contract:

- `sync_weights(llm, hf_model)` streams `hf_model.state_dict()` (names as the checkpoint has them,
  e.g. `model.language_model.layers.0.mlp.up_proj.weight`) into the in-process model of a running
  `vllm.LLM` through the model's own `load_weights` (vLLM maps the names with the model class's
  `hf_to_vllm_mapper` and fuses q/k/v and gate/up itself). No engine is rebuilt. The load runs
  inside vLLM's in-place reload wrapper (`model_loader.reload`: `initialize_layerwise_reload` /
  `finalize_layerwise_reload`, what `Worker.reload_weights` runs), because after the first load
  vLLM may have repacked a layer's weight into kernel form (on CPU every linear weight is packed
  into a oneDNN handle and the parameter emptied): a bare `load_weights` would then write into an
  empty tensor or leave the packed copy stale. It then drops everything computed from the old
  weights (the prefix cache's KV blocks, the encoder cache's vision embeddings) and re-applies
  the vision input-norm repair (`input_norms`). It raises `WeightSyncError` rather than do
  nothing when the engine's model cannot be reached (an engine in another process) or when a
  parameter of the engine got no tensor.
- `logprob_gap(llm, hf_model, processor)` samples a few short completions from the engine (text
  prompts and one image prompt) with the sampled tokens' logprobs, recomputes those tokens'
  logprobs with a forward pass of `hf_model` (fp32, the same temperature and vision-token ban the
  engine applied) and returns the largest absolute difference; `check_synced` raises
  `WeightSyncError` above `SYNC_TOLERANCE` (1e-3).

Invariant: after `sync_weights(llm, m)` returns, every request the engine serves is computed from
`m`'s weights only, so `logprob_gap(llm, m, processor) <= SYNC_TOLERANCE`.

The engine must be awake and idle (no request in flight) during a sync.
"""

from __future__ import annotations

import inspect
from typing import Any, Iterable, Iterator, Optional, Sequence

from ..families import BANNED_SPECIAL_TOKENS, padded_token_ids
from ..logit_bias import dense_logit_bias
from .input_norms import restore_engine_input_norms
from .sampling import BANNED_LOGIT_BIAS

SYNC_TOLERANCE = 1e-3

# Short prompts, and one longer than a KV block (128 tokens on CPU, 16 on GPU) so that a repeated
# check hits the prefix cache: a sync that kept the old weights' cached KV is caught.
_PASSAGE = "Revenue grew in every quarter of the year, led by the services segment and a strong second half. "
DEFAULT_PROMPTS = ("What is the total revenue in the table?", _PASSAGE * 4 + "Summarise the passage.",
                   "Which page shows the balance sheet?")


class WeightSyncError(RuntimeError):
    """The engine's weights could not be synced, or do not serve the weights that were synced."""


# --- reaching the engine -------------------------------------------------------------------------

def engine_worker(llm: Any) -> Any:
    """The in-process worker of a `vllm.LLM` (the path EasyR1's sharding manager uses)."""
    try:
        worker = llm.llm_engine.model_executor.driver_worker.worker
        worker.model_runner.model  # noqa: B018 - must exist
    except AttributeError as error:
        raise WeightSyncError(
            "cannot reach the engine's model in this process (llm.llm_engine.model_executor.driver_worker"
            ".worker.model_runner.model): a multiprocess engine (VLLM_ENABLE_V1_MULTIPROCESSING=1) or "
            f"not a vllm.LLM ({type(llm).__name__}); build the rollout engine in-process to sync weights"
        ) from error
    return worker


def checkpoint_weights(hf_model: Any) -> Iterator[tuple[str, Any]]:
    """(name, tensor) of the model's state dict, named as its saved checkpoint names them."""
    for name, tensor in hf_model.state_dict().items():
        yield name, tensor.detach()


# --- the sync ------------------------------------------------------------------------------------

def load_in_place(llm: Any, weights: Iterable[tuple[str, Any]]) -> set:
    """`model.load_weights(weights)` inside vLLM's in-place reload; returns the engine's names loaded."""
    import torch
    from vllm.config import set_current_vllm_config

    worker = engine_worker(llm)
    model = worker.model_runner.model
    vllm_config = llm.llm_engine.vllm_config
    with set_current_vllm_config(vllm_config), torch.no_grad():
        try:
            from vllm.model_executor.model_loader.reload import (finalize_layerwise_reload,
                                                                 initialize_layerwise_reload)
        except ImportError:  # older vLLM: weights stay in their loaded form, a plain load is enough
            return set(model.load_weights(weights) or ())
        initialize_layerwise_reload(model)
        loaded = model.load_weights(weights)
        finalize_layerwise_reload(model, vllm_config.model_config)
    return set(loaded or ())


def drop_stale_state(llm: Any) -> None:
    """Forget what the engine computed from the old weights: cached KV blocks and vision embeddings."""
    if not llm.reset_prefix_cache():
        raise WeightSyncError("vLLM refused to reset its prefix cache (requests still running?): "
                              "cached KV of the old weights would be reused")
    llm.llm_engine.reset_encoder_cache()


def sync_weights(llm: Any, hf_model: Any) -> int:
    """Load `hf_model`'s weights into the running engine; returns how many tensors were streamed."""
    engine_worker(llm)  # fail before streaming anything
    streamed = 0

    def counted() -> Iterator[tuple[str, Any]]:
        nonlocal streamed
        for item in checkpoint_weights(hf_model):
            streamed += 1
            yield item

    loaded = load_in_place(llm, counted())
    missing = unloaded_parameters(engine_worker(llm).model_runner.model, loaded)
    drop_stale_state(llm)
    restore_engine_input_norms(llm)
    if missing:
        raise WeightSyncError(f"{len(missing)} engine parameters got no tensor from the model "
                              f"(e.g. {sorted(missing)[:5]}): is it the engine's architecture?")
    return streamed


def unloaded_parameters(model: Any, loaded: set) -> set:
    """Engine parameters not named in `loaded` (empty when the load reported no names)."""
    if not loaded:
        return set()
    return {name for name, _ in model.named_parameters()} - loaded


# --- the check -----------------------------------------------------------------------------------

def banned_token_ids(tokenizer: Any, width: Optional[int] = None) -> list[int]:
    """The ids the rollout bans: the vision special tokens, and the padded embedding rows past the
    tokenizer when the logits' `width` is given."""
    ids = [tokenizer.convert_tokens_to_ids(token) for token in BANNED_SPECIAL_TOKENS]
    vision = {i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id and i >= 0}
    return sorted(vision | set(padded_token_ids(width, len(tokenizer))))


def check_image() -> Any:
    """A small deterministic picture (a few visual tokens) so the check covers the vision tower."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (112, 84), (250, 250, 245))
    draw = ImageDraw.Draw(image)
    draw.rectangle([8, 8, 90, 60], outline=(20, 20, 20), width=3)
    draw.line([10, 70, 100, 20], fill=(200, 30, 30), width=4)
    return image


def check_requests(processor: Any, prompts: Sequence[str], with_image: bool) -> list[tuple[dict, list]]:
    """(vLLM prompt, images) per request: chat-templated text, the last one with an image."""
    requests = []
    for i, text in enumerate(prompts):
        image = check_image() if with_image and i == len(prompts) - 1 else None
        content = ([{"type": "image"}] if image is not None else []) + [{"type": "text", "text": text}]
        chat = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                             tokenize=False)
        prompt: dict = {"prompt": chat}
        if image is not None:
            prompt["multi_modal_data"] = {"image": [image]}
        requests.append((prompt, [image] if image is not None else []))
    return requests


def sampling_params(temperature: float, max_tokens: int, seed: int, banned: Sequence[int]) -> Any:
    from vllm import SamplingParams

    return SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed, logprobs=0,
                          logit_bias={token: BANNED_LOGIT_BIAS for token in banned})


def hf_logprobs(hf_model: Any, processor: Any, ids: Any, images: list, bias: dict[int, float], temperature: float,
                processed: bool, first: int = 0) -> Any:
    """Log-probabilities over the logits (the padded vocabulary) at positions `first`.. of `ids`, by
    transformers: (L - first, V)."""
    import torch

    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    inputs = {"input_ids": ids[None], "attention_mask": torch.ones_like(ids)[None]}
    if "mm_token_type_ids" in inspect.signature(hf_model.forward).parameters:  # transformers 5.x
        inputs["mm_token_type_ids"] = (ids == image_pad).int()[None]
    if images:
        inputs.update(processor.image_processor(images=images, return_tensors="pt"))
    with torch.no_grad():
        keep = len(ids) - first  # sliced again after the call: transformers 4.x's Qwen2-VL ignores it
        logits = hf_model(**inputs, logits_to_keep=keep).logits[0, -keep:].float()
    if processed:
        logits = (logits + dense_logit_bias(bias, logits.shape[-1])) / temperature
    return torch.log_softmax(logits, dim=-1)


def logprob_gap(llm: Any, hf_model: Any, processor: Any, prompts: Sequence[str] = DEFAULT_PROMPTS,
                with_image: bool = True, max_tokens: int = 8, temperature: float = 0.7, seed: int = 0) -> float:
    """Largest |engine logprob - transformers logprob| over the tokens the engine samples."""
    import torch

    mode = getattr(llm.llm_engine.model_config, "logprobs_mode", "raw_logprobs")
    if mode not in ("processed_logprobs", "raw_logprobs"):
        raise ValueError(f"cannot check an engine whose logprobs_mode is {mode!r}")
    processed = mode == "processed_logprobs"
    banned = banned_token_ids(processor.tokenizer, hf_model.get_output_embeddings().weight.shape[0])
    requests = check_requests(processor, prompts, with_image)
    outputs = llm.generate([prompt for prompt, _ in requests], sampling_params(temperature, max_tokens, seed, banned),
                           use_tqdm=False)
    bias = {token: BANNED_LOGIT_BIAS for token in banned}
    gap, compared = 0.0, 0
    for (_, images), output in zip(requests, outputs):
        completion = output.outputs[0]
        prompt_ids, sampled = list(output.prompt_token_ids), list(completion.token_ids)
        ids = torch.tensor(prompt_ids + sampled)
        # the positions that predict the sampled tokens: from the prompt's last on
        logprobs = hf_logprobs(hf_model, processor, ids, images, bias, temperature, processed, len(prompt_ids) - 1)
        for j, token in enumerate(sampled):
            engine_value = completion.logprobs[j][token].logprob
            expected = float(logprobs[j, token])
            gap = max(gap, abs(float(engine_value) - expected))
            compared += 1
    if compared == 0:
        raise WeightSyncError("the engine sampled no token to compare")
    return gap


def check_synced(llm: Any, hf_model: Any, processor: Any, tolerance: float = SYNC_TOLERANCE,
                 **kwargs: Any) -> float:
    """`logprob_gap`, raising `WeightSyncError` when it exceeds `tolerance`; returns the gap."""
    gap = logprob_gap(llm, hf_model, processor, **kwargs)
    if not gap <= tolerance:  # also catches NaN
        raise WeightSyncError(f"the engine does not serve the synced weights: logprob gap {gap:.3e} "
                              f"> {tolerance:.0e} against a transformers forward pass")
    return gap


def sync_and_check(llm: Any, hf_model: Any, processor: Any, **kwargs: Any) -> tuple[int, float]:
    """`sync_weights` then `check_synced`: (tensors streamed, gap)."""
    return sync_weights(llm, hf_model), check_synced(llm, hf_model, processor, **kwargs)


__all__ = ["SYNC_TOLERANCE", "WeightSyncError", "check_synced", "logprob_gap", "sync_and_check", "sync_weights"]
