"""Bad configuration and bad input fail early with messages that say what to fix."""

import pytest

from tests.rollout.agent_helpers import prompt_batch, sample_prompts
from vrag_rollout import AgentRolloutConfig, vLLMRolloutAgent
from vrag_rollout.core.vision import narrowed_band
from vrag_rollout.core.vision import PixelBand


def test_unknown_keys_are_rejected_not_ignored():
    with pytest.raises(ValueError, match="unknown rollout config keys: \\['max_turn'\\]"):
        AgentRolloutConfig.from_any({"max_turn": 3})
    assert AgentRolloutConfig.from_any({"max_turns": 3, "n": 2}).max_turns == 3


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ({"n": 0}, "n must be"),
        ({"top_n": 0}, "top_n must be"),
        ({"max_turns": 0}, "max_turns must be"),
        ({"page_min_pixels": 10, "page_max_pixels": 5}, "page_min_pixels <= page_max_pixels"),
        ({"fetch_modes": ("image", "audio")}, "fetch_modes"),
        ({"position_ids_layout": "5"}, "position_ids_layout"),
        ({"retriever_timeout": 0}, "retriever_timeout"),
        ({"action_format": "xml"}, "action_format must be one of"),
    ],
)
def test_invalid_values(overrides, fragment):
    with pytest.raises(ValueError, match=fragment):
        AgentRolloutConfig(**overrides)


def test_page_band_is_narrowed_to_the_trainers_band_or_refused():
    band = PixelBand(16 * 784, 64 * 784)
    assert narrowed_band(band, 32 * 784, None) == PixelBand(32 * 784, 64 * 784)
    assert narrowed_band(band, None, 48 * 784) == PixelBand(16 * 784, 48 * 784)
    with pytest.raises(ValueError, match="does not overlap"):
        narrowed_band(band, 100 * 784, 200 * 784)


def agent(tiny_model_dir, tiny_processor, **overrides):
    config = AgentRolloutConfig(**{"prompt_length": 384, "response_length": 64, **overrides})
    # the engine is never reached: every case below fails before generation
    return vLLMRolloutAgent(str(tiny_model_dir), config, tiny_processor.tokenizer, tiny_processor,
                            inference_engine=object(), retriever=object())


def test_page_band_outside_the_processors_band_is_refused(tiny_model_dir, tiny_processor):
    own = PixelBand.from_processor(tiny_processor)  # the released limits: 3,136 to 12,845,056 pixels
    for low, high in ((16 * 784, 2 * own.max_pixels), (own.min_pixels // 2, 64 * 784)):
        with pytest.raises(ValueError, match="inside the image processor's own band"):
            agent(tiny_model_dir, tiny_processor, page_min_pixels=low, page_max_pixels=high)


def test_missing_document_column_names_the_fix(tiny_model_dir, tiny_processor):
    rollout = agent(tiny_model_dir, tiny_processor, page_min_pixels=16 * 784, page_max_pixels=64 * 784)
    prompts = prompt_batch(tiny_processor, sample_prompts(2, with_images=False), rollout)
    del prompts.non_tensor_batch["doc_id"]
    with pytest.raises(ValueError, match="pop 'doc_id' into the generation batch"):
        rollout.generate_sequences(prompts)


def test_unset_lengths_are_refused(tiny_model_dir, tiny_processor):
    with pytest.raises(ValueError, match="prompt_length and response_length must be set"):
        vLLMRolloutAgent(str(tiny_model_dir), AgentRolloutConfig(), tiny_processor.tokenizer, tiny_processor,
                         inference_engine=object(), retriever=object())


def test_an_unreadable_chat_template_file_is_refused_by_name(tiny_model_dir, tiny_processor, tmp_path):
    missing = tmp_path / "no-such-template.jinja"
    with pytest.raises(ValueError, match="no-such-template.jinja.*cannot be read"):
        agent(tiny_model_dir, tiny_processor, action_format="tool_call", chat_template=str(missing),
              page_min_pixels=16 * 784, page_max_pixels=64 * 784)


def test_tool_call_prompts_without_the_tool_schemas_are_refused(tiny_model_dir, tiny_processor):
    """A tool_call rollout of prompts rendered without tools= would train calls to tools the
    prompt never showed: refused before generation, naming the fix."""
    from vrag_rollout.devkit.demo import demo_prompts

    rollout = agent(tiny_model_dir, tiny_processor, action_format="tool_call", prompt_length=1024,
                    page_min_pixels=16 * 784, page_max_pixels=64 * 784)
    plain = prompt_batch(tiny_processor, sample_prompts(2, with_images=False), rollout)
    with pytest.raises(ValueError, match=r"prompt 0 does not carry the schemas of \['search', 'fetch'\]"):
        rollout.generate_sequences(plain)
    with_tools = demo_prompts(tiny_processor.tokenizer, tiny_processor, sample_prompts(2, with_images=False),
                              rollout.config)
    assert rollout.driver.episodes(with_tools, 2)  # the same rollout accepts prompts that carry them
