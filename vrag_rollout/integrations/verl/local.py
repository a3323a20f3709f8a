"""verl's `AgentLoopWorker` in this process, without Ray: what `scripts/check_verl.py` and the tests
run `vrag_agent` inside.

`local_worker(model_dir, llm, settings)` builds the worker as its Ray actor would be built: the
class a job's `GuardedAgentLoopManager` spawns (`guard.GuardedAgentLoopWorker`, verl's worker whose
postprocessed batches go through the live guard; `worker_class` names another subclass, e.g. the
check script's fault injection), with the attributes `generate_sequences` reads (config, tokenizer and processor from
`verl.utils.hf_tokenizer`/`hf_processor`, which bind the family's `get_rope_index`, the dataset
class, no tools, no reward workers), and a `LocalTokenServer` over `llm` as its server manager and
`vrag_agent` registered as an `agent_loop_config_path` entry registers it (its `_target_` plus the
loop's `vrag` settings). `settings` are `AgentRolloutConfig` fields: the ones verl owns
(`agent_loop.FROM_VERL`) go to verl's rollout config, the rest to the loop.

`prompt_rows(samples, action_format)` are dataset rows as verl's `RLHFDataset` hands them to the
loop (chat messages, `doc_id`, a `vrag_sample` index for seeds), `n` copies of each adjacent.
"""

from __future__ import annotations

from typing import Any, Sequence

AGENT_LOOP_TARGET = "vrag_rollout.integrations.verl.agent_loop.VragAgentLoop"


def local_worker(model_dir: str, llm: Any, settings: dict, worker_class: Any = None) -> Any:
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer import hf_processor, hf_tokenizer

    from ...engine.stand_ins.token_server import LocalTokenServer
    from .agent_loop import AGENT_NAME, FROM_VERL
    from .guard import GuardedAgentLoopWorker

    from ...engine.llm import engine_limits

    rollout = {key: settings[key] for key in FROM_VERL if key in settings}
    rollout["logprobs_mode"] = engine_limits(llm)[1] or "processed_logprobs"  # the engine's own, as verl sets it
    config = OmegaConf.create({
        "actor_rollout_ref": {"model": {"path": str(model_dir)}, "rollout": {
            **rollout, "val_kwargs": {"top_p": 1.0, "top_k": -1, "temperature": 0},
            "agent": {"default_agent_loop": AGENT_NAME}, "full_determinism": False,
            "multi_turn": {"max_user_turns": 8, "max_assistant_turns": 8}}},
        "data": {}})
    vrag = {key: value for key, value in settings.items() if key not in FROM_VERL and key != "n"}
    _agent_loop_registry[AGENT_NAME] = {"_target_": AGENT_LOOP_TARGET, "vrag": vrag}
    worker = object.__new__(worker_class or GuardedAgentLoopWorker)
    worker.config, worker.rollout_config = config, config.actor_rollout_ref.rollout
    worker.tokenizer, worker.processor = hf_tokenizer(str(model_dir)), hf_processor(str(model_dir))
    from transformers import AutoConfig

    worker.hf_model_type = AutoConfig.from_pretrained(str(model_dir)).model_type
    worker.dataset_cls, worker.mm_processor_kwargs = RLHFDataset, {}
    worker.reward_loop_worker_handles, worker.distillation_enabled, worker.tools = None, False, []
    worker.llm_client = LocalTokenServer(llm, worker.tokenizer.convert_tokens_to_ids("<|image_pad|>"),
                                         int(settings["response_length"]))
    return worker


def prompt_rows(samples: Sequence[Any], action_format: str, n: int = 1) -> Any:
    """A verl DataProto of `samples` (`data.prompts.PromptSample`, text only) as agent-loop rows."""
    import numpy as np
    import torch
    from verl.protocol import DataProto

    from ...data.prompts import AGENT_INSTRUCTIONS
    from ...formats import format_named
    from .agent_loop import AGENT_NAME, SAMPLE_COLUMN

    if any(sample.images for sample in samples):
        raise ValueError("prompt_rows builds text-only prompts; images come through verl's RLHFDataset")
    rows = [(sample, copy) for sample in samples for copy in range(n)]
    messages = np.empty(len(rows), dtype=object)
    for i, (sample, _) in enumerate(rows):
        instructions = sample.instructions
        if instructions == AGENT_INSTRUCTIONS:  # the default: the format's own
            instructions = format_named(action_format).instructions
        messages[i] = [{"role": "user", "content": [{"type": "text", "text": f"{instructions}\nQuestion: {sample.question}"}]}]

    def column(values: list) -> np.ndarray:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

    return DataProto.from_single_dict({
        "dummy_tensor": torch.zeros(len(rows), 1, dtype=torch.uint8),
        "raw_prompt": messages, "agent_name": column([AGENT_NAME] * len(rows)),
        "doc_id": column([sample.doc_id for sample, _ in rows]), SAMPLE_COLUMN: column(list(range(len(rows)))),
        "data_source": column(["vrag"] * len(rows)), "uid": column([f"q{i // n}" for i in range(len(rows))]),
        "extra_info": column([{"index": i} for i in range(len(rows))]), "index": column(list(range(len(rows)))),
    })
