"""`vrag_rollout.build_prompts`, the documented way to build a prompt batch outside a trainer:
the config's action format decides instructions and tool schemas, the batch fits the config, and
the native format's own prompt check (the rollout's refusal of prompts without the schemas) accepts it."""

from __future__ import annotations

import pytest

from vrag_rollout import AgentRolloutConfig, PromptSample, build_prompts
from vrag_rollout.data.prompts import AGENT_INSTRUCTIONS, TOOL_CALL_INSTRUCTIONS
from vrag_rollout.formats import ToolCallFormat

from tests.rollout.agent_helpers import cover_image


def config(**overrides):
    return AgentRolloutConfig(**{"prompt_length": 1024, "response_length": 64, **overrides})


def decoded(batch, tokenizer, row):
    return tokenizer.decode(batch.non_tensor_batch["raw_prompt_ids"][row])


@pytest.mark.parametrize("action_format", ["tags", "tool_call"])
def test_questions_to_a_batch_for_each_action_format(tiny_processor, action_format):
    tokenizer = tiny_processor.tokenizer
    samples = [PromptSample("Which page covers solar panels?", doc_id="annual_report"),
               PromptSample("What does E42 mean?", doc_id="product_guide", images=[cover_image(1)], instructions="Be brief.")]
    batch = build_prompts(samples, tokenizer=tokenizer, processor=tiny_processor, config=config(action_format=action_format))
    assert batch.batch["input_ids"].shape == (2, 1024) and batch.batch["position_ids"].shape == (2, 4, 1024)
    assert list(batch.non_tensor_batch["doc_id"]) == ["annual_report", "product_guide"]
    first, second = decoded(batch, tokenizer, 0), decoded(batch, tokenizer, 1)
    assert "Which page covers solar panels?" in first and "Be brief.\nQuestion: What does E42 mean?" in second
    assert second.count("<|image_pad|>") == 1 and "multi_modal_data" in batch.non_tensor_batch
    default = TOOL_CALL_INSTRUCTIONS if action_format == "tool_call" else AGENT_INSTRUCTIONS
    assert default in first
    assert samples[0].instructions == AGENT_INSTRUCTIONS  # the caller's samples are not changed
    tools_shown = '"name": "fetch"' in first
    assert tools_shown == (action_format == "tool_call")
    check = ToolCallFormat(config(action_format="tool_call"), tokenizer).check_prompts
    if action_format == "tool_call":  # the rollout's own check accepts the prompts
        check(batch.non_tensor_batch["raw_prompt_ids"], tokenizer)
    else:  # and refuses the tags format's (the control)
        with pytest.raises(ValueError, match="does not carry the schemas"):
            check(batch.non_tensor_batch["raw_prompt_ids"], tokenizer)


def test_the_config_decides_key_and_layout(tiny_processor):
    batch = build_prompts([PromptSample("q?", doc_id="d")], tokenizer=tiny_processor.tokenizer,
                          processor=tiny_processor, config=config(doc_id_key="document", position_ids_layout="3"))
    assert list(batch.non_tensor_batch["document"]) == ["d"] and batch.batch["position_ids"].shape == (1, 3, 1024)
    with pytest.raises(ValueError, match="no samples"):
        build_prompts([], tokenizer=tiny_processor.tokenizer, processor=tiny_processor, config=config())
    with pytest.raises(ValueError, match="exceeds prompt_length=16"):
        build_prompts([PromptSample("q?", doc_id="d")], tokenizer=tiny_processor.tokenizer, processor=tiny_processor,
                      config=config(prompt_length=16))
