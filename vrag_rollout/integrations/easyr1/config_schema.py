"""The run's config schema: EasyR1's `PPOConfig` with `worker.rollout` retyped as a class that is
both EasyR1's `RolloutConfig` and the agent's `AgentRolloutConfig`, and the checks an agent run
needs before anything starts (pixel bands, token budget, advantage estimator)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable, Optional, Sequence

from ...config import AgentRolloutConfig, guard_samples_under
from ...formats import FORMATS
from .common import AGENT_ROLLOUT_NAME, CONFIG_CLASS_NAME, MODULE, lock
from .detect import require_easyr1
from .segments import segment_problems

# EasyR1's RolloutConfig fields (hiyouga/EasyR1 b44b311, verl/workers/rollout/config.py).
EASYR1_ROLLOUT_FIELDS = (
    "name", "n", "temperature", "top_p", "top_k", "seed", "limit_images", "dtype",
    "gpu_memory_utilization", "ignore_eos", "enforce_eager", "enable_chunked_prefill",
    "tensor_parallel_size", "max_model_len", "max_num_batched_tokens", "disable_log_stats",
    "disable_tqdm", "val_override_config", "prompt_length", "response_length", "trust_remote_code",
)

# EasyR1's advantage estimators (b44b311, verl/trainer/core_algos.py `AdvantageEstimator`) and
# what an agent run (observation tokens masked out of `response_mask`) makes of each.
SUPPORTED_ESTIMATORS = {
    "grpo": "outcome score times the mask: observations simply get no gradient",
    "grpo_passk": "outcome score times the mask, as grpo",
    "rloo": "outcome score times the mask, as grpo",
    "reinforce_plus_plus": "returns skip observation tokens (the integration's estimator patch)",
    "remax": "baseline rollout output stripped to what the trainer pops (the adapter)",
    "vrag_turn": "turn-level reward-to-go, leave-one-out baseline (turn_estimators.py)",
    "vrag_gigpo": "GiGPO step groups by pages seen, nested in the episode groups (turn_estimators.py)",
}
REFUSED_ESTIMATORS = {
    "gae": (
        "EasyR1's GAE (b44b311, core_algos.compute_gae_advantage_return) tests "
        "`if response_mask[:, t]` on a whole batch column, which raises 'Boolean value of Tensor "
        "with more than one value is ambiguous' for any batch of two or more samples; use grpo, "
        "grpo_passk, rloo, reinforce_plus_plus or remax"
    ),
}

_config_classes: dict = {}


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
    with lock:
        cls = _config_classes.get(CONFIG_CLASS_NAME)
        if cls is None:
            require_easyr1()
            from verl.workers.rollout.config import RolloutConfig

            cls = make_rollout_config_class(RolloutConfig)
            _config_classes[CONFIG_CLASS_NAME] = cls
        return cls


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


def check_estimator(name: Any) -> list:
    """Problems with `algorithm.adv_estimator` for an agent run (empty list = supported)."""
    name = str(getattr(name, "value", name))
    if name in SUPPORTED_ESTIMATORS:
        return []
    if name in REFUSED_ESTIMATORS:
        return [f"algorithm.adv_estimator={name} is not supported with the agent rollout: {REFUSED_ESTIMATORS[name]}"]
    return [f"algorithm.adv_estimator={name} is unknown to the agent integration "
            f"(supported: {', '.join(SUPPORTED_ESTIMATORS)})"]


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
    problems.extend(check_tool_call_template(getattr(ppo_config.data, "override_chat_template", None),
                                             getattr(rollout, "action_format", "tags"),
                                             getattr(rollout, "chat_template", None)))
    algorithm = getattr(ppo_config, "algorithm", None)
    if algorithm is not None and getattr(algorithm, "adv_estimator", None) is not None:
        problems.extend(check_estimator(algorithm.adv_estimator))
    problems.extend(segment_problems(ppo_config))
    return problems


def check_tool_call_template(data_override: Optional[str], action_format: str,
                             rollout_template: Optional[str]) -> list:
    """A format whose chat template renders its tool turns (tool_call) renders prompts and tool
    turns with one template. EasyR1 applies `data.override_chat_template` to the driver's
    tokenizer only (the dataset's), never to the rollout workers', so the two would differ unless
    the rollout names the same file."""
    fmt = FORMATS.get(action_format)  # an unknown format is the config check's to report
    if not data_override or fmt is None or not fmt.renders_tools:
        return []
    same = rollout_template and os.path.realpath(rollout_template) == os.path.realpath(data_override)
    if same:
        return []
    return [f"data.override_chat_template ({data_override}) must also be worker.rollout.chat_template "
            f"(now {rollout_template!r}) in a tool_call run: the prompts and the tool turns must come from "
            "one template"]


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
    rollout = ppo_config.worker.rollout
    if hasattr(rollout, "guard_samples_dir"):  # "auto": beside the run's checkpoints, as an absolute path
        trainer = getattr(ppo_config, "trainer", None)
        found = guard_samples_under(rollout.guard_samples_dir, getattr(trainer, "save_checkpoint_path", None))
        rollout.guard_samples_dir = os.path.abspath(found) if found else found
    problems = check_agent_config(ppo_config)
    if problems:
        raise ValueError("config is not usable with the vrag agent: " + "; ".join(problems))
    return ppo_config
