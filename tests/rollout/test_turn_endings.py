"""Endings and bands on the real engine: the trainer's pixel band narrowing retrieved pages and
prompt images, and the max_turns ending."""

from __future__ import annotations

from tests.conftest import SAMPLE_RETRIEVAL
from tests.rollout.agent_helpers import make_agent, processor_grids, prompt_batch, sample_images, sample_prompts
from vrag_rollout.retrieval.fixtures import FixtureTransport
from vrag_rollout.retrieval.client import RetrieverClient

P = 28 * 28


def replay() -> RetrieverClient:
    return RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))


def test_the_trainers_pixel_band_narrows_pages_and_prompt_images(tiny_model_dir, tiny_processor, tiny_llm):
    """EasyR1 hands its data band in meta_info; the actor rescales every image into it before its
    processor runs, so the rollout's pages and prompt images must already lie inside it."""
    low, high = 20 * P, 40 * P  # inside the page band (16..64 * 28 * 28), narrower on both sides
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, replay(), n=2)
    prompts = prompt_batch(tiny_processor, sample_prompts(6), agent, meta_info={"min_pixels": low, "max_pixels": high})
    output = agent.generate_sequences(prompts)
    pad = tiny_processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    retrieved = 0
    for row in range(len(output)):
        images = sample_images(output, row)
        prompt_count = len(prompts.non_tensor_batch["multi_modal_data"][row // 2]["images"])
        for k, image in enumerate(images):
            if k >= prompt_count:  # a retrieved page: resized into the narrowed band
                assert low <= image.width * image.height <= high, (row, k, image.size)
                retrieved += 1
        if images:  # the actor's processor on these images agrees with the pad runs
            grids = processor_grids(tiny_processor, images)
            valid = output.batch["attention_mask"][row].bool()
            assert int((output.batch["input_ids"][row][valid] == pad).sum()) == int(grids.prod(-1).sum()) // 4
    assert retrieved > 0


def test_a_tool_call_on_the_last_turn_ends_the_episode_unexecuted(tiny_model_dir, tiny_processor, tiny_llm):
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, replay(), n=2, max_turns=2,
                       action_regex=r"<search>battery life and Zigbee radio</search>")
    output = agent.generate_sequences(prompt_batch(tiny_processor, sample_prompts(3, with_images=False), agent))
    tokenizer = tiny_processor.tokenizer
    for row in range(len(output)):
        used = int(output.batch["response_mask"][row].sum())
        text = tokenizer.decode(output.batch["responses"][row][:used].tolist())
        assert output.non_tensor_batch["termination_reason"][row] == "max_turns"
        assert output.non_tensor_batch["num_turns"][row] == 2
        assert text.count("<result>") == 1 and text.endswith("</search>")  # the second call never ran
        assert int(output.batch["loss_mask"][row][used - 1]) == 1  # ends on a sampled token
