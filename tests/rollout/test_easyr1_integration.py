"""The EasyR1 glue (vrag_rollout.integrations.easyr1), tested without EasyR1.

EasyR1 is not on PyPI and the installed `verl` is volcengine's, a different project. So: the
config and yaml are checked with OmegaConf against the real field names of EasyR1 (b44b311), the
"not installed" paths against the real environment, and the patches against a small stand-in
package laid out like EasyR1 (only the names and behaviours the glue touches).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError
from tensordict import TensorDict

from vrag_rollout.config import AgentRolloutConfig
from vrag_rollout.integrations import easyr1 as glue

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "easyr1_vrag.yaml"
# Every example trainer config: Qwen2.5-VL-7B (EXAMPLE) and Qwen3-VL-4B.
EXAMPLES = sorted((REPO / "examples").glob("easyr1_vrag*.yaml"))

# Field names of EasyR1's config dataclasses at b44b311 (verl/trainer/config.py, workers/*/config.py).
EASYR1_SECTIONS = {
    "data": {
        "train_files", "val_files", "prompt_key", "answer_key", "image_key", "video_key", "image_dir",
        "video_fps", "max_prompt_length", "max_response_length", "rollout_batch_size",
        "mini_rollout_batch_size", "val_batch_size", "format_prompt", "override_chat_template",
        "shuffle", "seed", "min_pixels", "max_pixels", "filter_overlong_prompts",
        "filter_overlong_prompts_workers",
    },
    "algorithm": {
        "gamma", "lam", "adv_estimator", "disable_kl", "use_kl_loss", "kl_penalty", "kl_coef",
        "kl_type", "kl_horizon", "kl_target", "online_filtering", "filter_key", "filter_low",
        "filter_high",
    },
    "trainer": {
        "total_epochs", "max_steps", "project_name", "experiment_name", "logger", "nnodes",
        "n_gpus_per_node", "max_try_make_batch", "critic_warmup", "val_freq", "val_before_train",
        "val_only", "val_generations_to_log", "save_freq", "save_limit", "save_model_only",
        "save_checkpoint_path", "load_checkpoint_path", "ray_timeline", "find_last_checkpoint",
    },
    "worker": {"hybrid_engine", "actor", "critic", "ref", "reward", "rollout"},
}


# ------------------------------------------------------------------------------------------
# Config and example yaml (no EasyR1 needed)
# ------------------------------------------------------------------------------------------
def test_structured_agent_config_rejects_unknown_and_mistyped_keys():
    schema = OmegaConf.structured(AgentRolloutConfig)
    with pytest.raises(ConfigKeyError):
        OmegaConf.merge(schema, {"search_url": "http://x"})
    with pytest.raises(ValidationError):
        OmegaConf.merge(schema, {"top_n": "three"})
    merged = OmegaConf.merge(schema, {"name": "vrag_agent", "top_n": 3, "fetch_modes": ["image"]})
    config = OmegaConf.to_object(merged)
    assert isinstance(config, AgentRolloutConfig)
    assert (config.name, config.top_n, config.fetch_modes) == ("vrag_agent", 3, ("image",))


def test_structured_agent_config_runs_validation_on_to_object():
    merged = OmegaConf.merge(OmegaConf.structured(AgentRolloutConfig), {"max_turns": 0})
    with pytest.raises(ValueError, match="max_turns"):
        OmegaConf.to_object(merged)


def test_there_is_an_example_per_documented_model():
    names = {path.name for path in EXAMPLES}
    assert {"easyr1_vrag.yaml", "easyr1_vrag_qwen3vl_4b.yaml"} <= names
    models = {OmegaConf.load(path).worker.actor.model.model_path for path in EXAMPLES}
    assert {"Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen3-VL-4B-Instruct", "Qwen/Qwen2.5-VL-3B-Instruct"} <= models


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_example_yaml_reward_and_estimator_are_usable(example):
    import importlib.util

    from vrag_rollout.core.reward import RewardWeights

    raw = OmegaConf.load(example)
    path, _, name = raw.worker.reward.reward_function.rpartition(":")
    spec = importlib.util.spec_from_file_location("custom_reward_fn", REPO / path)  # as EasyR1 loads it
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kwargs = OmegaConf.to_container(raw.worker.reward.reward_function_kwargs)
    RewardWeights(**kwargs)  # the weights are the reward's
    truth = '{"answer": "Ada", "doc_id": "d", "gold_pages": [1], "page_ids": [["d_1"]]}'
    [score] = getattr(module, name)([{"response": "<answer>Ada</answer>", "response_length": 3,
                                      "ground_truth": truth}], **kwargs)
    assert score["overall"] == pytest.approx(sum(kwargs.values()))
    assert glue.check_estimator(raw.algorithm.adv_estimator) == []


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_example_yaml_rollout_section_loads_into_agent_config(example):
    raw = OmegaConf.load(example)
    merged = OmegaConf.merge(OmegaConf.structured(AgentRolloutConfig), raw.worker.rollout)
    config = OmegaConf.to_object(merged)
    assert config.name == glue.AGENT_ROLLOUT_NAME
    assert config.doc_id_key == "doc_id"
    assert config.fetch_modes == ("image", "text")
    assert config.val_override_config["n"] == 1
    budget = raw.data.max_prompt_length + raw.data.max_response_length
    assert config.max_num_batched_tokens >= budget
    assert glue.check_pixel_bands(raw.data.min_pixels, raw.data.max_pixels,
                                  config.page_min_pixels, config.page_max_pixels) == []


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_example_yaml_other_sections_use_easyr1_keys_only(example):
    raw = OmegaConf.to_container(OmegaConf.load(example))
    assert set(raw) <= set(EASYR1_SECTIONS)
    for section, keys in EASYR1_SECTIONS.items():
        unknown = set(raw.get(section, {})) - keys
        assert not unknown, f"{section}: {sorted(unknown)} are not EasyR1 keys"


def test_pixel_band_check_flags_pages_the_actor_would_resize():
    # EasyR1's default data band (262144..4194304) against VRAG's 256..512 * 28*28 pages.
    problems = glue.check_pixel_bands(262144, 4194304, 256 * 28 * 28, 512 * 28 * 28)
    assert len(problems) == 1 and "page_min_pixels" in problems[0]
    assert glue.check_pixel_bands(None, None, 1, 10**9) == []
    assert "page_max_pixels" in glue.check_pixel_bands(0, 1000, 10, 2000)[0]


def test_generated_config_class_has_every_easyr1_rollout_field():
    @dataclasses.dataclass
    class RolloutConfig:  # EasyR1's shape: plain fields plus three init=False "auto keys"
        name: str = "vllm"
        disable_log_stats: bool = True
        tensor_parallel_size: int = 2
        prompt_length: int = dataclasses.field(default=-1, init=False)

    cls = glue.make_rollout_config_class(RolloutConfig, module=__name__)
    assert issubclass(cls, RolloutConfig) and issubclass(cls, AgentRolloutConfig)
    extra = [f for f in glue.EASYR1_ROLLOUT_FIELDS if f not in {f.name for f in dataclasses.fields(RolloutConfig)}]
    assert glue.missing_rollout_fields(cls, [*extra, "disable_log_stats"]) == []
    config = cls(top_n=5)
    assert config.tensor_parallel_size == AgentRolloutConfig().tensor_parallel_size  # agent defaults win
    assert config.disable_log_stats is True  # inherited from EasyR1
    assert config.to_dict()["top_n"] == 5
    with pytest.raises(ValueError):
        cls(top_n=0)  # the agent's validation still runs


# ------------------------------------------------------------------------------------------
# Without EasyR1 (the real environment: volcengine's verl or nothing)
# ------------------------------------------------------------------------------------------
@pytest.fixture
def no_easyr1(monkeypatch):
    if glue.easyr1_location() is not None:
        pytest.skip("EasyR1 is installed here")
    monkeypatch.setattr(glue.config_schema, "_config_classes", {})


def test_everything_that_needs_easyr1_fails_clearly_without_it(no_easyr1):
    for call in (glue.require_easyr1, glue.install_agent_rollout, glue.worker_setup_hook,
                 glue.easyr1_rollout_config_class, lambda: glue.load_ppo_config([])):
        with pytest.raises(glue.EasyR1NotAvailable, match="hiyouga/EasyR1"):
            call()
    with pytest.raises(glue.EasyR1NotAvailable):
        getattr(glue, glue.CONFIG_CLASS_NAME)
    with pytest.raises(AttributeError):
        glue.no_such_name  # noqa: B018


@pytest.mark.process
def test_module_entry_point_exits_with_the_reason(no_easyr1):
    import subprocess

    run = subprocess.run([sys.executable, "-m", glue.MODULE, "config=examples/easyr1_vrag.yaml"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "EasyR1NotAvailable" in run.stderr and "hiyouga/EasyR1" in run.stderr


def test_other_verl_is_named_in_the_error(no_easyr1, monkeypatch, tmp_path):
    fake = tmp_path / "verl"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "protocol.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    _forget_verl(monkeypatch)
    with pytest.raises(glue.EasyR1NotAvailable, match="is not EasyR1"):
        glue.require_easyr1()
    monkeypatch.setattr(glue.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(glue.EasyR1NotAvailable, match="no package named"):
        glue.require_easyr1()


def test_runtime_env_installs_the_hook_and_forwards_the_doc_column():
    class Rollout:
        doc_id_key = "document"
        page_count_key = "pages"

    class Worker:
        rollout = Rollout()

    class PPO:
        worker = Worker()

    env = glue.make_runtime_env(PPO(), env_vars={"EXTRA": "1"})
    assert env["worker_process_setup_hook"] == glue.SETUP_HOOK
    module, _, func = glue.SETUP_HOOK.rpartition(".")
    assert module == glue.__name__ and callable(getattr(glue, func))
    assert env["env_vars"][glue.GENERATION_KEYS_ENV] == "document,pages"
    assert env["env_vars"]["EXTRA"] == "1"


def test_the_per_turn_rewards_switch_reaches_the_ray_workers(monkeypatch):
    """The trainer's turn estimators read VRAG_TURN_REWARDS in its Ray actor: the runtime_env carries it."""
    from vrag_rollout.integrations.easyr1.turn_estimators import TURN_REWARDS_ENV

    monkeypatch.setenv(TURN_REWARDS_ENV, "retrieval")
    assert glue.make_runtime_env()["env_vars"][TURN_REWARDS_ENV] == "retrieval"
    monkeypatch.delenv(TURN_REWARDS_ENV)
    assert TURN_REWARDS_ENV not in glue.make_runtime_env()["env_vars"]


# ------------------------------------------------------------------------------------------
# Pure helpers
# ------------------------------------------------------------------------------------------
def test_image_fingerprints_follow_content_not_identity():
    from PIL import Image

    a = Image.new("RGB", (4, 4), (10, 20, 30))
    b = Image.new("RGB", (4, 4), (10, 20, 30))
    c = Image.new("RGB", (4, 4), (10, 20, 31))
    assert glue.image_fingerprint(a) == glue.image_fingerprint(b) != glue.image_fingerprint(c)
    assert glue.image_fingerprint({"bytes": b"x"}) == glue.image_fingerprint(b"x")
    assert glue.image_fingerprint("p.png") != glue.image_fingerprint("q.png")
    assert glue.image_fingerprint(object()) != glue.image_fingerprint(object())


def test_cache_keys_share_only_identical_samples():
    prompt = "question.png"
    data = [{"images": [prompt, "d1p1"]}, {"images": [prompt, "d1p2"]}, {"images": [prompt, "d1p1"]},
            {"images": [prompt]}]
    keys = glue.sample_cache_keys(data, ["u", "u", "u", "v"])
    assert keys[0] == keys[2] and keys[0] != keys[1]
    assert len(set(glue.sample_cache_keys(data))) == 4  # no uid: never shared across rows


# ------------------------------------------------------------------------------------------
# Against a stand-in laid out like EasyR1
# ------------------------------------------------------------------------------------------
FAKE_EASYR1 = {
    "__init__.py": "",
    "protocol.py": '''
        from dataclasses import dataclass, field
        from tensordict import TensorDict

        @dataclass
        class DataProto:
            batch: object = None
            non_tensor_batch: dict = field(default_factory=dict)
            meta_info: dict = field(default_factory=dict)

            def pop(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None):
                assert batch_keys is not None
                tensors = {k: self.batch.pop(k) for k in batch_keys if k in self.batch.keys()}
                columns = {k: self.non_tensor_batch.pop(k) for k in (non_tensor_batch_keys or [])
                           if k in self.non_tensor_batch}
                meta = {k: self.meta_info.pop(k) for k in (meta_info_keys or []) if k in self.meta_info}
                return DataProto(TensorDict(tensors, batch_size=self.batch.batch_size), columns, meta)
    ''',
    "utils/__init__.py": "",
    "utils/dataset.py": '''
        def process_image(image, min_pixels, max_pixels):
            return image

        def process_video(video, min_pixels, max_pixels, video_fps):
            return video

        class RLHFDataset:  # b44b311: keyword construction, prompts rendered without tools=
            def __init__(self, data_path, tokenizer, processor, prompt_key="prompt", max_prompt_length=1024,
                         filter_overlong_prompts=True):
                self.tokenizer, self.processor, self.prompt_key = tokenizer, processor, prompt_key

            def render(self, example):
                content = [{"type": "image"}, {"type": "text", "text": example[self.prompt_key]}]
                messages = [{"role": "user", "content": content}]
                return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ''',
    "workers/__init__.py": "",
    "workers/rollout/__init__.py": '''
        from .config import RolloutConfig
        from .vllm_rollout_spmd import vLLMRollout
    ''',
    "workers/rollout/config.py": '''
        from dataclasses import asdict, dataclass, field
        from typing import Any, Optional

        @dataclass
        class RolloutConfig:
            name: str = "vllm"
            n: int = 1
            temperature: float = 1.0
            top_p: float = 1.0
            top_k: int = -1
            seed: int = 1
            limit_images: int = 0
            dtype: str = "bf16"
            gpu_memory_utilization: float = 0.6
            ignore_eos: bool = False
            enforce_eager: bool = False
            enable_chunked_prefill: bool = False
            tensor_parallel_size: int = 2
            max_model_len: Optional[int] = None
            max_num_batched_tokens: int = 8192
            disable_log_stats: bool = True
            disable_tqdm: bool = False
            val_override_config: dict[str, Any] = field(default_factory=dict)
            prompt_length: int = field(default=-1, init=False)
            response_length: int = field(default=-1, init=False)
            trust_remote_code: bool = field(default=False, init=False)

            def to_dict(self):
                return asdict(self)
    ''',
    "workers/rollout/vllm_rollout_spmd.py": '''
        BUILT = []
        ENGINE_KWARGS = []

        def LLM(**kwargs):  # EasyR1 builds vllm.LLM with fixed keywords, no logprobs_mode
            ENGINE_KWARGS.append(kwargs)
            return kwargs

        class vLLMRollout:
            def __init__(self, model_path, config, tokenizer, processor, **kwargs):
                self.config = config
                LLM(model=model_path, dtype="bf16")
                self.inference_engine = ("easyr1-engine", config.limit_images)
                BUILT.append(self)
    ''',
    "workers/fsdp_workers.py": '''
        import numpy as np
        from .rollout import vLLMRollout

        class FSDPWorker:
            def __init__(self, config, processor=None):
                self.config = config
                self.processor = processor
                self._cache = {}

            def _build_rollout(self, **kwargs):
                self.rollout = vLLMRollout(model_path="model", config=self.config.rollout,
                                           tokenizer="tokenizer", processor=self.processor, **kwargs)

            def _process_multi_modal_inputs(self, data):  # EasyR1's per-uid cache
                seen, out = {}, []
                for uid, mm in zip(data.non_tensor_batch["uid"], data.non_tensor_batch["multi_modal_data"]):
                    if uid not in seen:
                        seen[uid] = dict(self.processor.image_processor(images=mm["images"]))
                    out.append(seen[uid])
                data.non_tensor_batch["multi_modal_inputs"] = np.array(out, dtype=object)
    ''',
    "workers/reward/__init__.py": "from .function import AutoRewardManager\n",
    "workers/reward/function.py": '''
        import torch

        class AutoRewardManager:  # EasyR1's shape: length from response_mask, score at length - 1
            seen = None

            def compute_reward(self, data):
                AutoRewardManager.seen = data
                lengths = data.batch["response_mask"].sum(-1).tolist()
                scores = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
                for row, length in enumerate(lengths):
                    scores[row, length - 1] = float(length)
                return scores, {"overall": [float(x) for x in lengths]}
    ''',
    "utils/torch_functional.py": '''
        def masked_whiten(values, mask):
            return ("whitened", values)
    ''',
    "trainer/core_algos.py": '''
        def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, gamma, **kwargs):
            raise AssertionError("EasyR1's REINFORCE++ must have been replaced")

        ADV_ESTIMATOR_MAP = {"reinforce_plus_plus": compute_reinforce_plus_plus_outcome_advantage}

        def compute_advantage_return(name, **kwargs):
            return ADV_ESTIMATOR_MAP[name](**kwargs)
    ''',
    "trainer/__init__.py": "",
    "trainer/main.py": "Runner = None\n",
    "trainer/ray_trainer.py": '''
        def compute_data_metrics(batch, use_critic=False):  # the trainer's per-step batch metrics
            return {"response_length/mean": float(batch.batch["response_mask"].sum(-1).float().mean())}
    ''',
    "trainer/config.py": '''
        from dataclasses import dataclass, field
        from typing import Optional
        from ..workers.rollout.config import RolloutConfig

        @dataclass
        class DataConfig:
            max_prompt_length: int = 512
            max_response_length: int = 512
            min_pixels: Optional[int] = 262144
            max_pixels: Optional[int] = 4194304

        @dataclass
        class WorkerConfig:
            rollout: RolloutConfig = field(default_factory=RolloutConfig)

        @dataclass
        class PPOConfig:
            data: DataConfig = field(default_factory=DataConfig)
            worker: WorkerConfig = field(default_factory=WorkerConfig)

            def deep_post_init(self):
                self.worker.rollout.prompt_length = self.data.max_prompt_length
                self.worker.rollout.response_length = self.data.max_response_length
    ''',
}

FAKE_AGENT = '''
import torch

class Agent:
    def __init__(self, model_path, config, tokenizer, processor, *, inference_engine=None, **kwargs):
        self.config = config
        self.inference_engine = inference_engine
        self.kwargs = kwargs

    def update_sampling_params(self, **kwargs):
        return kwargs

    def generate_sequences(self, prompts):
        return prompts


class Engineless:
    def __init__(self, model_path, config, tokenizer, processor, **kwargs):
        self.inference_engine = None


class PassingOn(Agent):  # a subclass that passes its arguments on, as scripts' agents do
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
'''


def _forget_verl(monkeypatch):
    for name in list(sys.modules):
        if name == "verl" or name.startswith("verl."):
            monkeypatch.delitem(sys.modules, name)


@pytest.fixture
def easyr1(tmp_path, monkeypatch):
    """A stand-in `verl` laid out like EasyR1, first on sys.path, removed afterwards."""
    root = tmp_path / "site"
    for rel, text in FAKE_EASYR1.items():
        path = root / "verl" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    (root / "fake_agent.py").write_text(FAKE_AGENT)
    monkeypatch.syspath_prepend(str(root))
    _forget_verl(monkeypatch)
    monkeypatch.setattr(glue.config_schema, "_config_classes", {})
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setenv(glue.AGENT_CLASS_ENV, "fake_agent:Agent")
    monkeypatch.delenv(glue.GENERATION_KEYS_ENV, raising=False)
    monkeypatch.delenv(glue.PROMPT_TOOLS_ENV, raising=False)
    yield root / "verl"
    for name in [n for n in sys.modules if n == "verl" or n.startswith("verl.")]:
        del sys.modules[name]  # the stand-in; monkeypatch then puts back what was there before
    sys.modules.pop("fake_agent", None)


def _agent_config(**kw):
    kw.setdefault("guard", "off")  # the stand-in's model path is no model (tests/verify/test_guard_easyr1.py guards)
    return glue.easyr1_rollout_config_class()(name=glue.AGENT_ROLLOUT_NAME, **kw)


def test_easyr1_is_recognised_by_layout(easyr1):
    assert glue.easyr1_location() == easyr1
    assert glue.require_easyr1() == easyr1


def test_config_class_fits_easyr1_schema_and_pickles(easyr1):
    from verl.trainer.config import PPOConfig
    from verl.workers.rollout.config import RolloutConfig

    cls = getattr(glue, glue.CONFIG_CLASS_NAME)
    assert cls is glue.easyr1_rollout_config_class()
    assert issubclass(cls, RolloutConfig) and issubclass(cls, AgentRolloutConfig)
    assert glue.missing_rollout_fields(cls) == []

    plain = OmegaConf.structured(PPOConfig())
    with pytest.raises(ConfigKeyError):  # EasyR1's schema alone rejects agent keys
        OmegaConf.merge(plain, {"worker": {"rollout": {"top_n": 3}}})
    schema = glue.swap_rollout_schema(OmegaConf.structured(PPOConfig()), cls)
    rollout_yaml = OmegaConf.load(EXAMPLE).worker.rollout
    config = OmegaConf.to_object(OmegaConf.merge(schema, {"worker": {"rollout": rollout_yaml}}))
    assert type(config.worker.rollout) is cls and config.worker.rollout.top_n == 2
    with pytest.raises(ConfigKeyError):
        OmegaConf.merge(schema, {"worker": {"rollout": {"search_url": "x"}}})

    restored = pickle.loads(pickle.dumps(config.worker.rollout))  # how Ray ships it to workers
    assert type(restored) is cls and restored == config.worker.rollout


def test_load_ppo_config_reads_yaml_and_overrides(easyr1, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(textwrap.dedent("""
        data: {max_prompt_length: 100, max_response_length: 900, min_pixels: 1000, max_pixels: 500000}
        worker:
          rollout: {name: vrag_agent, page_min_pixels: 1000, page_max_pixels: 400000}
    """))
    config = glue.load_ppo_config([f"config={path}", "worker.rollout.top_n=4"])
    assert config.worker.rollout.top_n == 4
    assert config.worker.rollout.response_length == 900
    with pytest.raises(ValueError, match="page_max_pixels"):
        glue.load_ppo_config([f"config={path}", "worker.rollout.page_max_pixels=600000"])


def test_rollout_dispatch_by_name(easyr1):
    glue.install_agent_rollout()
    from verl.workers.fsdp_workers import FSDPWorker
    from verl.workers.rollout.config import RolloutConfig

    class Cfg:
        def __init__(self, rollout):
            self.rollout = rollout

    from verl.workers.rollout.vllm_rollout_spmd import BUILT

    worker = FSDPWorker(Cfg(RolloutConfig()))
    worker._build_rollout()
    assert worker.rollout is BUILT[-1]  # EasyR1's own rollout, unwrapped

    config = _agent_config(max_turns=3, top_n=2)
    worker = FSDPWorker(Cfg(config))
    worker._build_rollout()
    assert isinstance(worker.rollout, glue.EasyR1RolloutAdapter)
    # the engine EasyR1 built, with room for the episode's images; what the sharding manager reads
    assert worker.rollout.inference_engine == ("easyr1-engine", config.images_per_sample())
    assert worker.rollout.config is config and config.limit_images == 0
    assert worker.rollout.update_sampling_params(n=1) == {"n": 1}
    # the agent's engine reports logprobs of the distribution sampled from; EasyR1's own does not change
    from verl.workers.rollout.vllm_rollout_spmd import ENGINE_KWARGS

    assert ENGINE_KWARGS[-1] == {"model": "model", "dtype": "bf16", "logprobs_mode": "processed_logprobs"}
    assert "logprobs_mode" not in ENGINE_KWARGS[0]
    import verl.workers.rollout.vllm_rollout_spmd as spmd

    assert spmd.LLM.__name__ == "LLM"  # restored after the build

    plain = RolloutConfig(name=glue.AGENT_ROLLOUT_NAME)
    with pytest.raises(TypeError, match="no agent fields"):
        FSDPWorker(Cfg(plain))._build_rollout()
    with pytest.raises(NotImplementedError, match="LoRA"):
        FSDPWorker(Cfg(_agent_config()))._build_rollout(lora_kwargs={"enable_lora": True})


def test_an_agent_taking_keywords_through_kwargs_gets_easyr1s_engine(easyr1, monkeypatch):
    """Not an engine of its own, which the sharding manager would never sync weights into."""
    monkeypatch.setenv(glue.AGENT_CLASS_ENV, "fake_agent:PassingOn")
    glue.install_agent_rollout()
    from verl.workers.fsdp_workers import FSDPWorker

    config = _agent_config(max_turns=3, top_n=2)
    worker = FSDPWorker(type("Cfg", (), {"rollout": config})())
    worker._build_rollout()
    assert worker.rollout.inference_engine == ("easyr1-engine", config.images_per_sample())


def test_agent_without_engine_is_rejected(easyr1, monkeypatch):
    monkeypatch.setenv(glue.AGENT_CLASS_ENV, "fake_agent:Engineless")
    glue.install_agent_rollout()
    from verl.workers.fsdp_workers import FSDPWorker

    worker = FSDPWorker(type("Cfg", (), {"rollout": _agent_config()})())
    with pytest.raises(TypeError, match="inference_engine"):
        worker._build_rollout()


@pytest.mark.parametrize("family", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def test_tool_call_runs_render_dataset_prompts_with_the_tools(family, easyr1, monkeypatch):
    """EasyR1's dataset renders prompts without tools=: in a tool_call job (the env the runtime_env
    sets) the patched dataset's prompts are the template's own rendering *with* the tools, which
    the rollout accepts; without it they stay as they were, and the rollout would refuse them."""
    from transformers import AutoProcessor

    from vrag_rollout.devkit.tiny_model import build_tiny_model, default_model_dir
    from vrag_rollout.core.tool_turns import TOOLS, ToolTurnTemplate

    model_dir = build_tiny_model(default_model_dir(family), family)
    glue.install_agent_rollout()
    from verl.utils.dataset import RLHFDataset

    example = {"prompt": "Which page covers the warranty?"}
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": example["prompt"]}]}]
    plain_processor = AutoProcessor.from_pretrained(model_dir)
    check = ToolTurnTemplate(plain_processor.tokenizer)
    expected = plain_processor.apply_chat_template(messages, tools=list(TOOLS), add_generation_prompt=True, tokenize=False)

    monkeypatch.delenv(glue.PROMPT_TOOLS_ENV, raising=False)
    plain = RLHFDataset(data_path="x.parquet", tokenizer=plain_processor.tokenizer, processor=plain_processor)
    assert check.missing_tools(plain.render(example)) == ["search", "fetch"]

    class Rollout:
        doc_id_key, action_format, chat_template = "doc_id", "tool_call", None

    class PPO:
        worker = type("Worker", (), {"rollout": Rollout()})()

    monkeypatch.setenv(glue.PROMPT_TOOLS_ENV, glue.make_runtime_env(PPO())["env_vars"][glue.PROMPT_TOOLS_ENV])
    processor = AutoProcessor.from_pretrained(model_dir)
    dataset = RLHFDataset(data_path="x.parquet", tokenizer=processor.tokenizer, processor=processor)
    assert dataset.render(example) == expected and check.missing_tools(expected) == []
    # Explicit tools= still wins, and patching twice leaves one default.
    glue.give_prompts_tools(processor.tokenizer, processor)
    assert processor.apply_chat_template(messages, tools=list(TOOLS[:1]), add_generation_prompt=True,
                                         tokenize=False) == plain_processor.apply_chat_template(
        messages, tools=list(TOOLS[:1]), add_generation_prompt=True, tokenize=False)
    assert processor.chat_template.count("vrag-rollout: default tools") == 1


def test_a_named_template_file_reaches_the_dataset(easyr1, monkeypatch, tmp_path, tiny_processor):
    from transformers import AutoProcessor

    from vrag_rollout.core.tool_turns import TOOLS

    named = tmp_path / "template.jinja"
    named.write_text("SYSTEM {{ tools | length }} tools{% for m in messages %}|{{ m.role }}{% endfor %}")
    monkeypatch.setenv(glue.PROMPT_TOOLS_ENV, json.dumps({"chat_template": str(named)}))
    glue.install_agent_rollout()
    from verl.utils.dataset import RLHFDataset

    processor = AutoProcessor.from_pretrained(tiny_processor.tokenizer.name_or_path)
    dataset = RLHFDataset(data_path="x.parquet", tokenizer=processor.tokenizer, processor=processor)
    assert dataset.render({"prompt": "q"}) == f"SYSTEM {len(TOOLS)} tools|user"
    # a run with the region action shows the crop tool too
    monkeypatch.setenv(glue.PROMPT_TOOLS_ENV, json.dumps({"chat_template": str(named), "region_action": True}))
    processor = AutoProcessor.from_pretrained(tiny_processor.tokenizer.name_or_path)
    dataset = RLHFDataset(data_path="x.parquet", tokenizer=processor.tokenizer, processor=processor)
    assert dataset.render({"prompt": "q"}) == f"SYSTEM {len(TOOLS) + 1} tools|user"
    monkeypatch.setenv(glue.PROMPT_TOOLS_ENV, "not json")
    with pytest.raises(ValueError, match="VRAG_PROMPT_TOOLS is not JSON"):
        RLHFDataset(data_path="x.parquet", tokenizer=processor.tokenizer, processor=processor)


def test_install_is_idempotent(easyr1):
    first = glue.install_agent_rollout()
    assert first == dict.fromkeys(
        ["rollout", "multi_modal_cache", "generation_columns", "reward_view", "estimators", "prompt_tools",
         "guard_metrics"], True)
    import verl.workers.fsdp_workers as fw

    dispatcher = fw.vLLMRollout
    assert glue.install_agent_rollout() == dict.fromkeys(first, False)
    assert fw.vLLMRollout is dispatcher
    assert not glue._is_patched(dispatcher.original)  # wraps EasyR1's class, not itself


def test_adapter_moves_loss_mask_into_response_mask(easyr1):
    from verl.protocol import DataProto

    valid = torch.tensor([[1, 1, 1, 1, 0]])
    loss = torch.tensor([[1, 0, 0, 1, 0]])
    out = DataProto(TensorDict({"response_mask": valid, "loss_mask": loss}, batch_size=[1]))
    adapted = glue.easyr1_masks(out)
    assert torch.equal(adapted.batch["response_mask"], loss)
    plain = DataProto(TensorDict({"response_mask": valid.clone()}, batch_size=[1]))
    assert torch.equal(glue.easyr1_masks(plain).batch["response_mask"], valid)


class CountingProcessor:
    """A fake image processor: per image one row of its name's code points, and a grid row."""

    def __init__(self):
        self.calls = 0
        self.images = 0
        self.image_processor = self

    def __call__(self, images=None, videos=None, return_tensors=None):
        self.calls += 1
        self.images += len(images)
        return {"pixel_values": _rows(images), "image_grid_thw": torch.ones((len(images), 3), dtype=torch.long)}


def _rows(names):
    return torch.tensor([[ord(c) for c in name.ljust(8)] for name in names])


def _mm_batch(images_per_sample, uids, meta=True):
    from verl.protocol import DataProto

    columns = {"uid": np.array(uids, dtype=object),
               "multi_modal_data": np.array([{"images": imgs} for imgs in images_per_sample], dtype=object)}
    info = {"min_pixels": 1, "max_pixels": 10**9, "video_fps": 2.0} if meta else {}
    return DataProto(TensorDict({}, batch_size=[len(uids)]), columns, info)


def test_image_cache_is_per_sample_not_per_uid(easyr1):
    from verl.workers.fsdp_workers import FSDPWorker

    samples = [["q", "page1"], ["q", "page2"], ["q", "page1"]]
    original = FSDPWorker(None, CountingProcessor())
    data = _mm_batch(samples, ["u", "u", "u"])
    original._process_multi_modal_inputs(data)
    got = [x["pixel_values"] for x in data.non_tensor_batch["multi_modal_inputs"]]
    assert torch.equal(got[1], _rows(["q", "page1"]))  # EasyR1 as shipped: sample 1 gets sample 0's pages

    glue.install_agent_rollout()
    processor = CountingProcessor()
    worker = FSDPWorker(None, processor)
    data = _mm_batch(samples, ["u", "u", "u"])
    worker._process_multi_modal_inputs(data)
    got = [dict(x.items()) for x in data.non_tensor_batch["multi_modal_inputs"]]
    for sample, inputs in zip(samples, got):
        assert torch.equal(inputs["pixel_values"], _rows(sample))
        assert torch.equal(inputs["image_grid_thw"], torch.ones((len(sample), 3), dtype=torch.long))
    assert processor.images == 3  # each distinct image processed once: q, page1, page2

    again = _mm_batch(samples, ["u", "u", "u"])  # next call of the same step: served from cache
    worker._process_multi_modal_inputs(again)
    assert processor.images == 3
    changed = _mm_batch([["q", "page3"]] * 3, ["u", "u", "u"])
    worker._process_multi_modal_inputs(changed)
    assert processor.images == 5
    assert torch.equal(changed.non_tensor_batch["multi_modal_inputs"][2]["pixel_values"], _rows(["q", "page3"]))


def test_image_cache_names_missing_meta(easyr1):
    glue.install_agent_rollout()
    from verl.workers.fsdp_workers import FSDPWorker

    with pytest.raises(KeyError, match="meta_info"):
        FSDPWorker(None, CountingProcessor())._process_multi_modal_inputs(_mm_batch([["a"]], ["u"], meta=False))


def _trainer_batch():
    from verl.protocol import DataProto

    tensors = TensorDict({"input_ids": torch.zeros(2, 3)}, batch_size=[2])
    columns = {"raw_prompt_ids": np.array([[1], [2]], dtype=object),
               "doc_id": np.array(["docA", "docB"], dtype=object),
               "uid": np.array(["u1", "u2"], dtype=object)}
    return DataProto(tensors, columns, {"min_pixels": 1})


def test_generation_pop_copies_doc_id(easyr1, monkeypatch):
    glue.install_agent_rollout()
    batch = _trainer_batch()
    gen = batch.pop(batch_keys=["input_ids"], non_tensor_batch_keys=["raw_prompt_ids", "multi_modal_data"],
                    meta_info_keys=["min_pixels"])
    assert list(gen.non_tensor_batch["doc_id"]) == ["docA", "docB"]
    assert list(batch.non_tensor_batch["doc_id"]) == ["docA", "docB"]  # kept for reward and union
    assert "uid" not in gen.non_tensor_batch and "raw_prompt_ids" not in batch.non_tensor_batch

    other = _trainer_batch().pop(batch_keys=["input_ids"], non_tensor_batch_keys=["uid"])
    assert "doc_id" not in other.non_tensor_batch  # only the generation pop is touched

    monkeypatch.setenv(glue.GENERATION_KEYS_ENV, "uid")
    gen = _trainer_batch().pop(batch_keys=["input_ids"], non_tensor_batch_keys=["raw_prompt_ids"])
    assert "uid" in gen.non_tensor_batch and "doc_id" not in gen.non_tensor_batch


def test_reward_sees_the_whole_response(easyr1):
    glue.install_agent_rollout()
    from verl.protocol import DataProto
    from verl.workers.reward import AutoRewardManager

    responses = torch.arange(10).view(2, 5)
    prompt = torch.ones(2, 3, dtype=torch.long)
    valid = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    loss = torch.tensor([[1, 0, 0, 1, 0], [1, 1, 0, 0, 0]])
    batch = TensorDict({"responses": responses, "response_mask": loss,
                        "attention_mask": torch.cat([prompt, valid], -1)}, batch_size=[2])
    data = DataProto(batch, {}, {})
    scores, metrics = AutoRewardManager().compute_reward(data)
    assert metrics == {"overall": [4.0, 2.0]}  # decoded lengths: the whole episodes
    assert torch.equal(scores, torch.tensor([[0, 0, 0, 4.0, 0], [0, 2.0, 0, 0, 0]]))
    assert torch.equal(data.batch["response_mask"], loss)  # the trainer's batch is untouched

    same = DataProto(TensorDict({"responses": responses, "response_mask": valid,
                                 "attention_mask": torch.cat([prompt, valid], -1)}, batch_size=[2]), {}, {})
    AutoRewardManager().compute_reward(same)
    assert AutoRewardManager.seen is same  # EasyR1's own rollout: scored exactly as before


def test_reward_of_an_episode_ending_on_an_observation_lands_on_its_last_sampled_token(easyr1):
    glue.install_agent_rollout()
    from verl.protocol import DataProto
    from verl.workers.reward import AutoRewardManager

    # sampled 0-1, observation 2-4 filling the budget exactly: EasyR1 would score position 4
    valid = torch.tensor([[1, 1, 1, 1, 1]])
    loss = torch.tensor([[1, 1, 0, 0, 0]])
    data = DataProto(TensorDict({"responses": torch.zeros(1, 5, dtype=torch.long), "response_mask": loss,
                                 "attention_mask": torch.cat([torch.ones(1, 2, dtype=torch.long), valid], -1)},
                                batch_size=[1]), {}, {})
    scores, _ = AutoRewardManager().compute_reward(data)
    assert torch.equal(scores, torch.tensor([[0, 5.0, 0, 0, 0]]))


def test_reward_function_gets_the_pages_shown_and_metrics_come_back(easyr1):
    glue.install_agent_rollout()
    from verl.protocol import DataProto
    from verl.workers.reward import AutoRewardManager

    truth = json.dumps({"answer": "Ada", "doc_id": "rep", "gold_pages": [2]})
    columns = {
        "ground_truth": np.array([truth, "plain answer"], dtype=object),
        "page_ids": np.array([[["rep_1", "rep_2"]], []], dtype=object),
        glue.METRICS_COLUMN: np.array([{"rollout/turns_mean": 2.0, "rollout/termination/eos": 1.0},
                                       {"rollout/turns_mean": 4.0}], dtype=object),
    }
    mask = torch.ones(2, 3, dtype=torch.long)
    data = DataProto(TensorDict({"responses": torch.zeros(2, 3, dtype=torch.long), "response_mask": mask,
                                 "attention_mask": torch.cat([mask, mask], -1)}, batch_size=[2]), columns, {})
    _, metrics = AutoRewardManager().compute_reward(data)
    seen = AutoRewardManager.seen.non_tensor_batch["ground_truth"]
    assert json.loads(seen[0]) == {"answer": "Ada", "doc_id": "rep", "gold_pages": [2], "page_ids": [["rep_1", "rep_2"]]}
    assert seen[1] == "plain answer"  # not ours: untouched
    assert data.non_tensor_batch["ground_truth"][0] == truth  # the trainer's batch is untouched
    assert metrics["agent/rollout/turns_mean"] == [2.0, 4.0]
    assert metrics["agent/rollout/termination/eos"] == [1.0, 0.0]


def test_patch_once_patches_an_own_attribute_once():
    from vrag_rollout.integrations.easyr1.common import mark_patched, patch_once

    class Base:
        def run(self):
            return "base"

    class Child(Base):
        def step(self):
            return "step"

    made = []

    def wrap(original):
        made.append(original)
        return mark_patched(lambda self: "patched " + original(self), original)

    assert patch_once(Child, "step", wrap) is True
    assert patch_once(Child, "step", wrap) is False  # already ours: not wrapped twice
    assert Child().step() == "patched step" and len(made) == 1
    with pytest.raises(AttributeError, match="no run of its own"):
        patch_once(Child, "run", wrap)  # inherited: not this class's to replace
    assert Base().run() == "base"


def test_fsdp_worker_without_the_image_hook_is_not_easyr1():
    import types

    from vrag_rollout.integrations.easyr1.rollout_adapter import patch_fsdp_workers

    module = types.SimpleNamespace(vLLMRollout=object, FSDPWorker=type("FSDPWorker", (), {}))
    with pytest.raises(glue.EasyR1NotAvailable, match="_process_multi_modal_inputs"):
        patch_fsdp_workers(module, rollout=False)


def test_setup_hook_patches_modules_when_first_imported(easyr1):
    assert "verl.workers.fsdp_workers" not in sys.modules
    glue.worker_setup_hook()
    assert "verl.workers.fsdp_workers" not in sys.modules  # the hook itself imports nothing heavy
    import verl.workers.fsdp_workers as fw
    from verl.protocol import DataProto

    assert isinstance(fw.vLLMRollout, glue.RolloutDispatcher)
    assert glue._is_patched(fw.FSDPWorker.__dict__["_process_multi_modal_inputs"])
    assert glue._is_patched(DataProto.__dict__["pop"])
    glue.worker_setup_hook()  # again: no second finder
    assert sum(isinstance(f, glue._PatchOnImport) for f in sys.meta_path) == 1


@pytest.mark.engine  # a Ray cluster whose worker imports verl's training stack
def test_hook_patches_inside_ray_worker_processes(easyr1):
    """The runtime_env from make_runtime_env reaches a real Ray worker and patches EasyR1 there."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("Ray is already running in this process")
    pythonpath = os.pathsep.join([str(easyr1.parent), str(REPO)])
    env = glue.make_runtime_env(env_vars={"PYTHONPATH": pythonpath})
    ray.init(num_cpus=1, include_dashboard=False, runtime_env=env, log_to_driver=False)
    try:
        @ray.remote
        class Probe:  # an actor with its own env_vars, as EasyR1's RayWorkerGroup creates them
            def check(self):
                import verl.workers.fsdp_workers as fw
                from verl.protocol import DataProto

                return (type(fw.vLLMRollout).__name__, glue._is_patched(DataProto.__dict__["pop"]),
                        os.environ.get("EXTRA"))

        probe = Probe.options(runtime_env={"env_vars": {"EXTRA": "x"}}).remote()
        assert ray.get(probe.check.remote(), timeout=120) == ("RolloutDispatcher", True, "x")
    finally:
        ray.shutdown()


# ------------------------------------------------------------------------------------------
# Against the real EasyR1, where it is installed (skipped otherwise)
# ------------------------------------------------------------------------------------------
@pytest.fixture
def real_easyr1(tmp_path, monkeypatch):
    if glue.easyr1_location() is None:
        pytest.skip("EasyR1 is not installed")
    monkeypatch.delenv(glue.GENERATION_KEYS_ENV, raising=False)
    scorer = tmp_path / "score.py"
    scorer.write_text(textwrap.dedent('''
        REWARD_TYPE = "batch"
        def compute_score(inputs):
            return [{"overall": float(x["response_length"])} for x in inputs]
    '''))
    return scorer


def test_real_easyr1_config_patches_union_and_reward(real_easyr1):
    config = glue.load_ppo_config([f"config={EXAMPLE}", f"worker.reward.reward_function={real_easyr1}:compute_score"])
    assert type(config.worker.rollout).__name__ == glue.CONFIG_CLASS_NAME
    assert config.worker.rollout.response_length == config.data.max_response_length
    assert pickle.loads(pickle.dumps(config)).worker.rollout == config.worker.rollout
    glue.install_agent_rollout()

    from verl.protocol import DataProto
    from verl.workers.reward.function import AutoRewardManager

    batch = DataProto.from_single_dict({
        "input_ids": torch.zeros(2, 3, dtype=torch.long),
        "raw_prompt_ids": np.array([[1], [2]], dtype=object),
        "doc_id": np.array(["A", "B"], dtype=object),
    })
    gen = batch.pop(batch_keys=["input_ids"], non_tensor_batch_keys=["raw_prompt_ids", "multi_modal_data"])
    assert list(gen.non_tensor_batch["doc_id"]) == ["A", "B"]
    same = DataProto.from_dict(tensors={"responses": torch.zeros(4, 5)},
                               non_tensors={"doc_id": np.repeat(gen.non_tensor_batch["doc_id"], 2)})
    assert list(batch.repeat(2, interleave=True).union(same).non_tensor_batch["doc_id"]) == ["A", "A", "B", "B"]
    other = DataProto.from_dict(tensors={"responses": torch.zeros(4, 5)},
                                non_tensors={"doc_id": np.array(["A", "B", "A", "B"], dtype=object)})
    with pytest.raises((ValueError, AssertionError)):
        batch.repeat(2, interleave=True).union(other)

    from verl.workers.reward.config import RewardConfig

    class Tokenizer:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(str(int(i)) for i in ids)

    reward_config = RewardConfig(reward_function=f"{real_easyr1}:compute_score")
    reward_config.post_init()
    valid, loss = torch.tensor([[1, 1, 1, 1, 0]]), torch.tensor([[1, 0, 0, 1, 0]])
    data = DataProto.from_dict(tensors={
        "responses": torch.tensor([[10, 11, 12, 13, 0]]), "response_mask": loss,
        "attention_mask": torch.cat([torch.ones(1, 2, dtype=torch.long), valid], -1)},
        non_tensors={"ground_truth": np.array(["g"], dtype=object)})
    scores, metrics = AutoRewardManager(reward_config, Tokenizer()).compute_reward(data)
    assert metrics["overall"] == [4.0] and scores[0, 3] == 4.0


def _tool_call_ppo(template=None, action_format="tool_call", region_action=False):
    class Rollout:
        doc_id_key, chat_template = "doc_id", template

    Rollout.action_format = action_format
    Rollout.region_action = region_action

    class PPO:
        worker = type("Worker", (), {"rollout": Rollout()})()

    return PPO()


def test_prompt_tools_follow_the_config_and_never_leak_into_a_tags_run(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    env = glue.make_runtime_env(_tool_call_ppo("templates/t.jinja"))["env_vars"]
    assert json.loads(env[glue.PROMPT_TOOLS_ENV]) == {"chat_template": str(tmp_path / "templates" / "t.jinja"),
                                                      "region_action": False}
    regions = glue.make_runtime_env(_tool_call_ppo(region_action=True))["env_vars"]
    assert json.loads(regions[glue.PROMPT_TOOLS_ENV]) == {"chat_template": None, "region_action": True}
    monkeypatch.setenv(glue.PROMPT_TOOLS_ENV, env[glue.PROMPT_TOOLS_ENV])  # as the entry point leaves it
    assert glue.PROMPT_TOOLS_ENV not in glue.make_runtime_env(_tool_call_ppo(action_format="tags"))["env_vars"]


def test_a_tool_call_run_renders_prompts_and_tool_turns_with_one_template(tmp_path):
    from vrag_rollout.integrations.easyr1.config_schema import check_tool_call_template

    override = tmp_path / "override.jinja"
    assert check_tool_call_template(str(override), "tags", None) == []
    assert check_tool_call_template(None, "tool_call", None) == []
    assert check_tool_call_template(str(override), "tool_call", str(override)) == []
    [problem] = check_tool_call_template(str(override), "tool_call", None)
    assert "must also be worker.rollout.chat_template" in problem
    assert check_tool_call_template(str(override), "tool_call", str(tmp_path / "other.jinja"))


def test_prompt_tools_need_a_string_template(tiny_processor):
    class NoTemplate:
        chat_template = {"default": "{{ messages }}"}  # transformers also allows named templates

    with pytest.raises(ValueError, match="needs a chat template"):
        glue.give_prompts_tools(NoTemplate(), None)
