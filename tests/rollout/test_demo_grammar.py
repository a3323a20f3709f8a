"""The demo exercises what it demonstrates: its first-turn grammar (`first_turn_action_regex`)
makes every episode search or fetch before it may answer, so pages come back as images in tool
turns in both action formats; later turns may answer. Control: without it, episodes answer at once."""

from __future__ import annotations

import pytest

from tests.conftest import SAMPLE_RETRIEVAL
from tests.rollout.agent_helpers import make_agent, sample_prompts
from vrag_rollout.devkit.demo import demo_config, demo_prompts
from vrag_rollout.retrieval.client import RetrieverClient
from vrag_rollout.retrieval.fixtures import FixtureTransport


def rollout(tiny_model_dir, tiny_processor, tiny_llm, action_format, **overrides):
    client = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
    lengths = {"prompt_length": 1024} if action_format == "tool_call" else {}
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=2, max_turns=3,
                       action_format=action_format, **lengths, **overrides)
    return agent.generate_sequences(demo_prompts(tiny_processor.tokenizer, tiny_processor,
                                                 sample_prompts(4, with_images=False), agent.config))


@pytest.mark.parametrize("action_format", ["tags", "tool_call"])
def test_every_demo_episode_retrieves_pages(tiny_model_dir, tiny_processor, tiny_llm, action_format):
    output = rollout(tiny_model_dir, tiny_processor, tiny_llm, action_format)
    # every episode holds an observation (a retrieved page, or the error of a page out of range)
    observed = (output.batch["response_mask"].bool() & ~output.batch["loss_mask"].bool()).any(-1)
    assert observed.all(), observed
    assert output.meta_info["metrics"]["rollout/images_retrieved"] > 0
    assert output.meta_info["action_grammar"]


def test_control_without_the_first_turn_grammar_some_episode_answers_at_once(tiny_model_dir, tiny_processor,
                                                                             tiny_llm):
    output = rollout(tiny_model_dir, tiny_processor, tiny_llm, "tool_call", first_turn_action_regex=None)
    observed = (output.batch["response_mask"].bool() & ~output.batch["loss_mask"].bool()).any(-1)
    assert not observed.all(), observed


def test_the_demo_config_sets_it_for_both_formats_and_yields_to_a_callers_grammar():
    for action_format in ("tags", "tool_call"):
        config = demo_config(action_format=action_format)
        assert config.first_turn_action_regex and "<answer>" not in config.first_turn_action_regex
        assert "<answer>" in config.action_regex
    assert demo_config(action_regex="<answer>x</answer>").first_turn_action_regex is None


@pytest.fixture(scope="module")
def live_url():
    """The embedded retriever on the demo's sample index: crops are rendered from its PDFs."""
    from retriever_server.api.testing import serve_in_thread
    from vrag_rollout.devkit.demo import cache_dir, prepare_index

    with serve_in_thread(prepare_index(cache_dir())) as url:
        yield url


@pytest.mark.parametrize("action_format", ["tags", "tool_call"])
def test_the_demo_grammar_looks_closer_with_the_region_action(tiny_model_dir, tiny_processor, tiny_llm, live_url,
                                                              action_format):
    """With `region_action=True` the demo's later turns may crop the last page shown (`<bbox>` or
    the crop tool): some episodes do, the crops come back as images labelled with their region,
    and the project's check passes on the batch."""
    from vrag_rollout.verify.check import check_batch
    from vrag_rollout.verify.saved_batch import from_dataproto

    with RetrieverClient(live_url) as client:
        agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=2, max_turns=5, region_action=True,
                           action_format=action_format)
        assert agent.config.action_regex and ("bbox" in agent.config.action_regex)
        assert "bbox" not in agent.config.first_turn_action_regex  # nothing shown before the first turn
        prompts = demo_prompts(tiny_processor.tokenizer, tiny_processor, sample_prompts(8, with_images=False),
                               agent.config)
        taught = "<crop>N, [x1" if action_format == "tags" else "Call crop to look closer"
        assert taught in tiny_processor.tokenizer.decode(list(prompts.non_tensor_batch["raw_prompt_ids"][0]))
        output = agent.generate_sequences(prompts)
    assert output.meta_info["metrics"]["rollout/crops"] >= 1, output.non_tensor_batch["termination_reason"]
    regions = [region for row in output.non_tensor_batch["image_regions"] for region in row if region is not None]
    assert regions and all(0 <= v <= 1 for region in regions for v in region)
    report = check_batch(from_dataproto(output, processor=tiny_processor, model_path=tiny_model_dir,
                                        config=agent.config), tiny_model_dir)
    assert report.ok, report.human()
