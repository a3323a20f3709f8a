"""Run `vrag_rollout.vLLMRolloutAgent` as the rollout of an EasyR1 (hiyouga/EasyR1) training job.

EasyR1 has no rollout registry: `FSDPWorker._build_rollout` always calls the module-global name
`vLLMRollout` of `verl.workers.fsdp_workers`, and its workers are Ray actors, so a patch made in
the driver does not reach them. This module therefore

* builds the config schema: EasyR1's `PPOConfig` with `worker.rollout` typed as a subclass of
  both EasyR1's `RolloutConfig` and our `AgentRolloutConfig` (OmegaConf only accepts a subclass of
  the declared type there, and rejects unknown keys);
* patches, inside every Ray worker process (through Ray's job-level `worker_process_setup_hook`):
  - `verl.workers.fsdp_workers.vLLMRollout` -> a dispatcher that builds the agent when
    `worker.rollout.name == "vrag_agent"` and EasyR1's own rollout otherwise;
  - `FSDPWorker._process_multi_modal_inputs` -> a version whose image cache is keyed per sample
    (uid + content of that sample's images) instead of per uid;
  - `DataProto.pop` -> the generation pop (the one that takes `raw_prompt_ids`) also *copies*
    the configured extra columns (default `doc_id`) into the generation batch;
  - `AutoRewardManager.compute_reward` -> the reward sees the whole response
    (`attention_mask[:, -R:]`) rather than `response_mask`, which has observation tokens zeroed;
* offers `main()`, a drop-in for `python -m verl.trainer.main` that does all of the above.

Nothing here imports EasyR1 at module import time: the PyPI package `verl` (volcengine's) has the
same import name, so EasyR1 is recognised by its file layout and every use fails with a clear
`EasyR1NotAvailable` when it is not installed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.abc
import importlib.util
import inspect
import os
import sys
import threading
import uuid
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from ..config import AgentRolloutConfig

AGENT_ROLLOUT_NAME = "vrag_agent"
DEFAULT_AGENT_CLASS = "vrag_rollout:vLLMRolloutAgent"
AGENT_CLASS_ENV = "VRAG_AGENT_CLASS"
GENERATION_KEYS_ENV = "VRAG_GENERATION_KEYS"
DEFAULT_GENERATION_KEYS = ("doc_id",)
MODULE = "vrag_rollout.integrations.easyr1"  # also when run as __main__: pickles must name this
SETUP_HOOK = MODULE + ".worker_setup_hook"
CONFIG_CLASS_NAME = "EasyR1AgentRolloutConfig"

# Files that only EasyR1's `verl` has (volcengine's verl lays these out differently).
EASYR1_MARKER_FILES = (
    "protocol.py",
    "trainer/config.py",
    "trainer/main.py",
    "utils/dataset.py",
    "workers/fsdp_workers.py",
    "workers/reward/function.py",
    "workers/rollout/config.py",
    "workers/rollout/vllm_rollout_spmd.py",
)

# EasyR1's RolloutConfig fields (hiyouga/EasyR1 b44b311, verl/workers/rollout/config.py).
EASYR1_ROLLOUT_FIELDS = (
    "name", "n", "temperature", "top_p", "top_k", "seed", "limit_images", "dtype",
    "gpu_memory_utilization", "ignore_eos", "enforce_eager", "enable_chunked_prefill",
    "tensor_parallel_size", "max_model_len", "max_num_batched_tokens", "disable_log_stats",
    "disable_tqdm", "val_override_config", "prompt_length", "response_length", "trust_remote_code",
)

# Environment EasyR1's own `main()` gives its Ray job (same intent, our own list).
DEFAULT_RAY_ENV_VARS = {
    "TOKENIZERS_PARALLELISM": "true",
    "NCCL_DEBUG": "WARN",
    "VLLM_LOGGING_LEVEL": "WARN",
    "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
}

_PATCH_MARK = "__vrag_original__"
_MM_KEYS = "vrag_mm_keys"
_MM_INPUTS = "vrag_mm_inputs"
_lock = threading.Lock()
_config_classes: dict = {}


class EasyR1NotAvailable(ImportError):
    """EasyR1's `verl` is not importable here (absent, or another package named `verl`)."""


# --------------------------------------------------------------------------------------------
# Detecting EasyR1
# --------------------------------------------------------------------------------------------
def easyr1_location() -> Optional[Path]:
    """The directory of an importable EasyR1 `verl` package, or None.

    Looks at files only (nothing is imported), so it is cheap and safe next to volcengine's verl.
    """
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        root = Path(location)
        if all((root / marker).is_file() for marker in EASYR1_MARKER_FILES):
            return root
    return None


def require_easyr1() -> Path:
    """The EasyR1 package directory; raises `EasyR1NotAvailable` with the reason otherwise."""
    root = easyr1_location()
    if root is not None:
        return root
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        found = "no package named `verl` is installed"
    else:
        where = list(spec.submodule_search_locations or [spec.origin])
        found = f"the `verl` found at {where} is not EasyR1 (it lacks e.g. verl/workers/rollout/config.py)"
    raise EasyR1NotAvailable(
        "the EasyR1 integration needs hiyouga/EasyR1 (its package is also named `verl`); "
        f"{found}. Install EasyR1 (e.g. `pip install -e <EasyR1 checkout>`) in every Ray worker's "
        "environment; volcengine's `verl` from PyPI is a different project."
    )


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------
def missing_rollout_fields(cls: type, required: Iterable[str] = EASYR1_ROLLOUT_FIELDS) -> list:
    """Field names of EasyR1's RolloutConfig that dataclass `cls` lacks."""
    names = {f.name for f in dataclasses.fields(cls)}
    return [name for name in required if name not in names]


def make_rollout_config_class(base: type, agent: type = AgentRolloutConfig,
                              name: str = CONFIG_CLASS_NAME, module: str = MODULE) -> type:
    """A dataclass that is a subclass of EasyR1's `base` RolloutConfig and of `agent`.

    `agent` comes first in the MRO, so its defaults and validation (`__post_init__`) win, while
    OmegaConf accepts the class where EasyR1 declares `rollout: RolloutConfig`. EasyR1-only
    fields `agent` lacks (e.g. `disable_log_stats`) are inherited from `base`; `to_dict` is
    provided because EasyR1 calls it.
    """
    if not (dataclasses.is_dataclass(base) and dataclasses.is_dataclass(agent)):
        raise TypeError("both config classes must be dataclasses")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    namespace = {"__module__": module, "__qualname__": name, "to_dict": to_dict,
                 "__doc__": f"EasyR1 RolloutConfig + agent fields ({agent.__name__})."}
    cls = dataclasses.dataclass(type(name, (agent, base), namespace))
    missing = missing_rollout_fields(cls, (f.name for f in dataclasses.fields(base)))
    if missing:  # cannot happen with a subclass; guards against a dataclass rewrite going wrong
        raise TypeError(f"{name} lost EasyR1 rollout fields {missing}")
    return cls


def easyr1_rollout_config_class() -> type:
    """The rollout config class for EasyR1 runs (built once per process, needs EasyR1)."""
    with _lock:
        cls = _config_classes.get(CONFIG_CLASS_NAME)
        if cls is None:
            require_easyr1()
            from verl.workers.rollout.config import RolloutConfig

            cls = make_rollout_config_class(RolloutConfig)
            _config_classes[CONFIG_CLASS_NAME] = cls
        return cls


def __getattr__(name: str) -> Any:
    # Lets pickle (Ray ships the config to every worker) find the dynamically built class as
    # `vrag_rollout.integrations.easyr1.EasyR1AgentRolloutConfig`.
    if name == CONFIG_CLASS_NAME:
        return easyr1_rollout_config_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def swap_rollout_schema(schema: Any, rollout_cls: type) -> Any:
    """Retype `schema.worker.rollout` (an OmegaConf structured config) as `rollout_cls`."""
    from omegaconf import OmegaConf

    current = OmegaConf.get_type(schema.worker.rollout)
    if current is not None and not issubclass(rollout_cls, current):
        raise TypeError(f"{rollout_cls.__name__} must subclass the schema's {current.__name__}")
    schema.worker.rollout = OmegaConf.structured(rollout_cls())
    return schema


def check_pixel_bands(data_min: Optional[int], data_max: Optional[int],
                      page_min: Optional[int], page_max: Optional[int]) -> list:
    """Problems with the page pixel band versus EasyR1's `data.min_pixels`/`data.max_pixels`.

    EasyR1's actor passes every image of `multi_modal_data` through `process_image(img,
    data.min_pixels, data.max_pixels)` before its image processor. A retrieved page the agent
    sized outside that band would be resized again and get another grid than the one its
    `<|image_pad|>` run was built for ("Image features and image tokens do not match").
    An unset page bound (the model's default, known once the processor is) is checked by the
    rollout itself, which narrows its band to the trainer's on every call.
    """
    problems = []
    if data_max is not None and page_max is not None and page_max > data_max:
        problems.append(f"worker.rollout.page_max_pixels ({page_max}) > data.max_pixels ({data_max})")
    if data_min is not None and page_min is not None and page_min < data_min:
        problems.append(f"worker.rollout.page_min_pixels ({page_min}) < data.min_pixels ({data_min})")
    return problems


def check_agent_config(ppo_config: Any) -> list:
    """Problems that would break an agent run under EasyR1 (empty list = fine)."""
    rollout = ppo_config.worker.rollout
    if getattr(rollout, "name", None) != AGENT_ROLLOUT_NAME:
        return []
    problems = check_pixel_bands(ppo_config.data.min_pixels, ppo_config.data.max_pixels,
                                 rollout.page_min_pixels, rollout.page_max_pixels)
    budget = rollout.prompt_length + rollout.response_length
    if rollout.max_num_batched_tokens < budget:
        problems.append(
            f"worker.rollout.max_num_batched_tokens ({rollout.max_num_batched_tokens}) < "
            f"max_prompt_length + max_response_length ({budget})"
        )
    return problems


def load_ppo_config(argv: Optional[Sequence[str]] = None) -> Any:
    """EasyR1's config loading (`config=<yaml>` plus dotlist overrides) with the agent schema."""
    require_easyr1()
    from omegaconf import OmegaConf
    from verl.trainer.config import PPOConfig

    cli = OmegaConf.from_cli(list(argv) if argv is not None else None)
    schema = swap_rollout_schema(OmegaConf.structured(PPOConfig()), easyr1_rollout_config_class())
    layers = [schema]
    if "config" in cli:
        layers.append(OmegaConf.load(cli.pop("config")))
    layers.append(cli)
    ppo_config = OmegaConf.to_object(OmegaConf.merge(*layers))
    ppo_config.deep_post_init()
    problems = check_agent_config(ppo_config)
    if problems:
        raise ValueError("config is not usable with the vrag agent: " + "; ".join(problems))
    return ppo_config


# --------------------------------------------------------------------------------------------
# Per-sample image cache
# --------------------------------------------------------------------------------------------
def _digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def image_fingerprint(image: Any) -> str:
    """A content key for one `multi_modal_data` entry (path, bytes, {"bytes"/"path"}, PIL, array).

    Unknown kinds get a fresh random key: never shared, never wrongly reused.
    """
    if isinstance(image, str):
        return "path:" + image
    if isinstance(image, (bytes, bytearray, memoryview)):
        return "bytes:" + _digest(bytes(image))
    if isinstance(image, dict):
        if image.get("bytes") is not None:
            return "bytes:" + _digest(bytes(image["bytes"]))
        if image.get("path"):
            return "path:" + str(image["path"])
    if hasattr(image, "tobytes") and hasattr(image, "mode") and hasattr(image, "size"):  # PIL
        return "pil:" + _digest(f"{image.mode}:{tuple(image.size)}".encode(), image.tobytes())
    if hasattr(image, "tobytes") and hasattr(image, "shape") and hasattr(image, "dtype"):  # numpy
        return "array:" + _digest(f"{image.dtype}:{tuple(image.shape)}".encode(), image.tobytes())
    return "opaque:" + uuid.uuid4().hex


def sample_cache_keys(multi_modal_data: Sequence[Any], uids: Optional[Sequence[Any]] = None) -> list:
    """One hashable key per sample: (uid or row, fingerprints of its images, of its videos).

    Samples of one prompt that hold the same images share a key (processed once, as EasyR1's
    per-uid cache intends); samples whose retrieved pages differ get their own.
    """
    memo: dict = {}  # id -> fingerprint; n copies of one prompt usually share objects

    def fingerprint(item: Any) -> str:
        key = id(item)
        if key not in memo:
            memo[key] = (item, image_fingerprint(item))  # keep item alive so ids are not reused
        return memo[key][1]

    keys = []
    for row, data in enumerate(multi_modal_data):
        data = data or {}
        images = tuple(fingerprint(x) for x in (data.get("images") or ()))
        videos = tuple(fingerprint(x) for x in (data.get("videos") or ()))
        owner = uids[row] if uids is not None else row
        keys.append((str(owner), images, videos))
    return keys


def build_multi_modal_inputs(multi_modal_data: Sequence[Any], keys: Sequence[Any], processor: Any,
                             process_image: Callable, process_video: Callable,
                             min_pixels: Optional[int], max_pixels: Optional[int],
                             video_fps: float) -> list:
    """Image-processor outputs per sample, computed once per distinct key."""
    done: dict = {}
    out = []
    for data, key in zip(multi_modal_data, keys):
        if key not in done:
            data = data or {}
            images = [process_image(x, min_pixels, max_pixels) for x in (data.get("images") or ())]
            videos = [process_video(x, min_pixels, max_pixels, video_fps) for x in (data.get("videos") or ())]
            if images:
                done[key] = dict(processor.image_processor(images=images, return_tensors="pt"))
            elif videos:
                done[key] = dict(processor.image_processor(images=None, videos=videos, return_tensors="pt"))
            else:
                done[key] = {}
        out.append(done[key])
    return out


def _process_multi_modal_inputs_per_sample(self: Any, data: Any) -> None:
    """Replacement for `FSDPWorker._process_multi_modal_inputs` (same inputs and outputs)."""
    import numpy as np
    from verl.utils.dataset import process_image, process_video

    columns = data.non_tensor_batch
    if "multi_modal_data" not in columns:
        return
    multi_modal_data = columns["multi_modal_data"]
    keys = sample_cache_keys(multi_modal_data, columns.get("uid"))
    if self._cache.get(_MM_KEYS) != keys:
        meta = data.meta_info
        try:
            bands = meta["min_pixels"], meta["max_pixels"], meta["video_fps"]
        except KeyError as missing:
            raise KeyError(
                f"meta_info lacks {missing}: the rollout must return the generation batch's "
                "meta_info (min_pixels, max_pixels, video_fps) unchanged"
            ) from None
        inputs = build_multi_modal_inputs(multi_modal_data, keys, self.processor, process_image,
                                          process_video, *bands)
        array = np.empty(len(inputs), dtype=object)
        array[:] = inputs
        self._cache[_MM_KEYS] = keys
        self._cache[_MM_INPUTS] = array
    columns["multi_modal_inputs"] = self._cache[_MM_INPUTS]


# --------------------------------------------------------------------------------------------
# Generation batch columns, reward view, output masks
# --------------------------------------------------------------------------------------------
def generation_keys() -> tuple:
    """Extra non-tensor columns copied into the generation batch (env `VRAG_GENERATION_KEYS`)."""
    raw = os.environ.get(GENERATION_KEYS_ENV)
    if raw is None:
        return DEFAULT_GENERATION_KEYS
    return tuple(key.strip() for key in raw.split(",") if key.strip())


def make_generation_pop(original: Callable, keys: Optional[Callable[[], Sequence[str]]] = None) -> Callable:
    """Wrap `DataProto.pop` so the trainer's generation pop also copies `keys()` columns.

    Only a pop that takes `raw_prompt_ids` (train and validation generation) is affected. The
    columns are copied, not moved: the trainer batch keeps them for the reward and the union, so
    the rollout must return them unchanged (repeated n times) or not at all.
    """
    keys = keys or generation_keys

    def pop(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None):
        out = original(self, batch_keys=batch_keys, non_tensor_batch_keys=non_tensor_batch_keys,
                       meta_info_keys=meta_info_keys)
        if non_tensor_batch_keys and "raw_prompt_ids" in non_tensor_batch_keys:
            for key in keys():
                if key in self.non_tensor_batch and key not in out.non_tensor_batch:
                    out.non_tensor_batch[key] = self.non_tensor_batch[key].copy()
        return out

    setattr(pop, _PATCH_MARK, original)
    pop.__doc__ = original.__doc__
    return pop


def full_response_view(data: Any) -> Any:
    """`data` with `response_mask` replaced by the response part of `attention_mask`.

    EasyR1's reward managers take the response length from `response_mask.sum(-1)`; with
    observation tokens zeroed that truncates the decoded text. For EasyR1's own rollout both
    masks are equal and `data` is returned as is.
    """
    import torch

    batch = data.batch
    if batch is None or "responses" not in batch.keys() or "attention_mask" not in batch.keys():
        return data
    width = batch["responses"].shape[-1]
    full = batch["attention_mask"][:, -width:]
    if "response_mask" in batch.keys():
        if torch.equal(full.to(batch["response_mask"].dtype), batch["response_mask"]):
            return data
        full = full.to(batch["response_mask"].dtype)
    view = batch.clone(recurse=False) if hasattr(batch, "clone") else dict(batch)
    view["response_mask"] = full
    return type(data)(batch=view, non_tensor_batch=data.non_tensor_batch, meta_info=data.meta_info)


def make_full_response_reward(original: Callable) -> Callable:
    def compute_reward(self, data):
        return original(self, full_response_view(data))

    setattr(compute_reward, _PATCH_MARK, original)
    compute_reward.__doc__ = original.__doc__
    return compute_reward


def easyr1_masks(output: Any) -> Any:
    """Adapt a rollout output that carries a separate `loss_mask` to EasyR1.

    EasyR1 has no `loss_mask`: `response_mask` is its only loss mask (policy loss, KL, advantages).
    The observation-zeroed mask therefore goes into `response_mask`; `attention_mask` keeps every
    real response token (observations included) so the actor still attends to them.
    """
    batch = output.batch
    if batch is None or "loss_mask" not in batch.keys():
        return output
    mask = batch["loss_mask"]
    if "response_mask" in batch.keys():
        mask = mask.to(batch["response_mask"].dtype)
    batch["response_mask"] = mask
    return output


class EasyR1RolloutAdapter:
    """Wraps the agent for EasyR1's worker: outputs get EasyR1's masks; everything else
    (`inference_engine` for the sharding manager, `update_sampling_params`, ...) is delegated."""

    def __init__(self, rollout: Any):
        engine = getattr(rollout, "inference_engine", None)
        if engine is None:
            raise TypeError(
                f"{type(rollout).__name__} has no `inference_engine`: EasyR1's "
                "FSDPVLLMShardingManager syncs the actor's weights into `rollout.inference_engine`, "
                "which must be a vllm.LLM built with distributed_executor_backend='external_launcher' "
                "and enable_sleep_mode=True"
            )
        self._rollout = rollout

    def generate_sequences(self, prompts: Any) -> Any:
        return easyr1_masks(self._rollout.generate_sequences(prompts))

    def __getattr__(self, name: str) -> Any:
        if name == "_rollout":  # not set yet (e.g. during copy): avoid recursing
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
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False
    return "inference_engine" in params


class RolloutDispatcher:
    """Stands in for EasyR1's `vLLMRollout` name inside `verl.workers.fsdp_workers`.

    For the agent, the vLLM engine is still built by EasyR1's own `vLLMRollout` (same
    `external_launcher` backend, sleep mode, dummy weights, LoRA hijack and initial sleep that the
    sharding manager expects), with `limit_images` raised to the images one episode may hold, and
    handed to the agent as `inference_engine`.
    """

    def __init__(self, original: Any):
        self.original = original
        setattr(self, _PATCH_MARK, original)

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
            base = self.original(model_path=model_path, config=engine_config, tokenizer=tokenizer,
                                 processor=processor, **kwargs)
            agent_kwargs["inference_engine"] = base.inference_engine
        rollout = agent_cls(model_path=model_path, config=config, tokenizer=tokenizer,
                            processor=processor, **agent_kwargs)
        return EasyR1RolloutAdapter(rollout)


# --------------------------------------------------------------------------------------------
# Installing the patches
# --------------------------------------------------------------------------------------------
def _is_patched(obj: Any) -> bool:
    return hasattr(obj, _PATCH_MARK)


def _patch_fsdp_workers(module: Any, rollout: bool = True, multi_modal_cache: bool = True) -> dict:
    done = {}
    if rollout:
        current = module.vLLMRollout
        done["rollout"] = not _is_patched(current)
        if done["rollout"]:
            module.vLLMRollout = RolloutDispatcher(current)
    if multi_modal_cache:
        worker_cls = module.FSDPWorker
        current = worker_cls.__dict__.get("_process_multi_modal_inputs")
        if current is None:
            raise EasyR1NotAvailable("this EasyR1 has no FSDPWorker._process_multi_modal_inputs")
        done["multi_modal_cache"] = not _is_patched(current)
        if done["multi_modal_cache"]:
            def patched(self, data, _impl=_process_multi_modal_inputs_per_sample):
                return _impl(self, data)

            setattr(patched, _PATCH_MARK, current)
            worker_cls._process_multi_modal_inputs = patched
    return done


def _patch_protocol(module: Any) -> dict:
    proto_cls = module.DataProto
    current = proto_cls.__dict__["pop"]
    done = {"generation_columns": not _is_patched(current)}
    if done["generation_columns"]:
        proto_cls.pop = make_generation_pop(current)
    return done


def _patch_reward(module: Any) -> dict:
    manager_cls = module.AutoRewardManager
    current = manager_cls.__dict__["compute_reward"]
    done = {"reward_view": not _is_patched(current)}
    if done["reward_view"]:
        manager_cls.compute_reward = make_full_response_reward(current)
    return done


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Applies a patch right after a target module is first executed, so that processes which
    never import it (reward actors, idle Ray workers) do not pay for importing vLLM."""

    def __init__(self, patches: dict):
        self.patches = patches

    def find_spec(self, fullname, path, target=None):
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Callable):
        self.loader = loader
        self.patch = patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)

    def __getattr__(self, name):  # get_source, get_filename, ... for tracebacks and inspect
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)


def install_agent_rollout(*, rollout: bool = True, multi_modal_cache: bool = True,
                          generation_columns: bool = True, reward_view: bool = True,
                          lazy: bool = False) -> dict:
    """Patch EasyR1 in this process (idempotent). Returns {patch name: newly installed?}.

    Must run in every Ray worker process: use `make_runtime_env()` with `ray.init` (the hook),
    or call it at the top of your own worker code. With `lazy=True`, modules not imported yet
    are patched when they are first imported (a patch then reports False until that happens).
    Raises `EasyR1NotAvailable` without EasyR1.
    """
    require_easyr1()
    targets = {}
    if rollout or multi_modal_cache:
        targets["verl.workers.fsdp_workers"] = lambda m: _patch_fsdp_workers(m, rollout, multi_modal_cache)
    if generation_columns:
        targets["verl.protocol"] = _patch_protocol
    if reward_view:
        targets["verl.workers.reward.function"] = _patch_reward
    done: dict = {}
    deferred = {}
    with _lock:
        for name, patch in targets.items():
            if lazy and name not in sys.modules:
                deferred[name] = patch
            else:
                done.update(patch(importlib.import_module(name)))
        if deferred:
            finder = next((f for f in sys.meta_path if isinstance(f, _PatchOnImport)), None)
            if finder is None:
                sys.meta_path.insert(0, _PatchOnImport(deferred))
            else:
                finder.patches.update(deferred)
    return done


def worker_setup_hook() -> None:
    """Ray `worker_process_setup_hook`: runs in each worker process before any task."""
    install_agent_rollout(lazy=True)


def make_runtime_env(ppo_config: Any = None, env_vars: Optional[dict] = None) -> dict:
    """A job-level Ray runtime_env that installs the patches in every worker process."""
    merged = dict(DEFAULT_RAY_ENV_VARS)
    if ppo_config is not None:
        doc_key = getattr(ppo_config.worker.rollout, "doc_id_key", None)
        if doc_key:
            merged[GENERATION_KEYS_ENV] = doc_key
    for name in (AGENT_CLASS_ENV, GENERATION_KEYS_ENV):
        if name in os.environ and name not in merged:
            merged[name] = os.environ[name]
    merged.update(env_vars or {})
    return {"env_vars": merged, "worker_process_setup_hook": SETUP_HOOK}


def main(argv: Optional[Sequence[str]] = None) -> None:
    """`python -m vrag_rollout.integrations.easyr1 config=examples/easyr1_vrag.yaml [k=v ...]`."""
    require_easyr1()
    import ray

    ppo_config = load_ppo_config(argv)
    if getattr(ppo_config.worker.rollout, "name", None) != AGENT_ROLLOUT_NAME:
        warnings.warn(f"worker.rollout.name is not {AGENT_ROLLOUT_NAME!r}: EasyR1's own rollout will run")
    runtime_env = make_runtime_env(ppo_config)
    os.environ.update({k: v for k, v in runtime_env["env_vars"].items() if k in (AGENT_CLASS_ENV, GENERATION_KEYS_ENV)})
    if ray.is_initialized():
        warnings.warn("Ray was initialised before main(): make sure its runtime_env has "
                      f"worker_process_setup_hook={SETUP_HOOK!r}, or workers run EasyR1's rollout")
    else:
        ray.init(runtime_env=runtime_env)
    from verl.trainer.main import Runner

    runner = Runner.remote()
    ray.get(runner.run.remote(ppo_config))


if __name__ == "__main__":
    # Run from the importable module, not this `__main__` copy: the config class and the patches
    # must live in `vrag_rollout.integrations.easyr1`, the name Ray workers resolve.
    importlib.import_module(MODULE).main()
