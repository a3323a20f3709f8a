"""The native tool-call format on real vLLM, for every family and both schedules: the demo grammar
makes the tiny model write real tool calls; every episode's tokens must be the chat template's own
rendering of the equivalent conversation (the oracle: processor.apply_chat_template), with sampled
tokens exactly the loss positions."""

from __future__ import annotations

import re

import pytest
import torch

from tests.conftest import SAMPLE_RETRIEVAL
from tests.rollout.agent_helpers import make_agent, sample_images, sample_prompts
from vrag_rollout.devkit.demo import demo_prompts
from vrag_rollout.retrieval.fixtures import FixtureTransport
from vrag_rollout.retrieval.client import RetrieverClient
from vrag_rollout.core.tool_turns import TOOLS

PADS = re.compile(r"(<\|image_pad\|>)+")
RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def native(family_model):
    fm = family_model
    outputs = {}
    for mode in ("sync", "continuous"):
        client = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
        agent = make_agent(fm.model_dir, fm.processor, fm.llm, client, n=2, action_format="tool_call",
                           prompt_length=1024, rollout_mode=mode)
        prompts = demo_prompts(fm.processor.tokenizer, fm.processor, sample_prompts(6), agent.config)
        outputs[mode] = agent.generate_sequences(prompts)
    return fm, prompts, outputs


def runs(mask: list[int]) -> list[tuple[int, int, int]]:
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i))
            start = i
    return out


def conversation(prompt_text: str, turns: list[tuple[int, str]], user_images: int) -> list:
    """The conversation the episode is, from its decoded turns: the user's question, each sampled
    assistant turn's raw text, each tool turn's responses (images, then text)."""
    question = prompt_text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0].replace(IMAGE, "")
    messages = [{"role": "user", "content": [{"type": "image"}] * user_images + [{"type": "text", "text": question}]}]
    for sampled, text in turns:
        if sampled:
            messages.append({"role": "assistant", "content": text.removesuffix("<|im_end|>")})
            continue
        for body in RESPONSE.findall(text):
            images = body.count(IMAGE)
            messages.append({"role": "tool", "content": [{"type": "image"}] * images
                             + [{"type": "text", "text": body.replace(IMAGE, "")}]})
    return messages


def test_both_schedules_give_the_same_native_episodes(native):
    _, _, outputs = native
    for key in ("responses", "loss_mask", "position_ids"):
        assert torch.equal(outputs["sync"].batch[key], outputs["continuous"].batch[key]), key


def test_tokens_are_the_templates_rendering_of_the_conversation(native):
    fm, prompts, outputs = native
    output = outputs["sync"]
    tok = fm.processor.tokenizer
    decode = lambda ids: PADS.sub("<|image_pad|>", tok.decode(ids, skip_special_tokens=False))  # noqa: E731
    width = prompts.batch["input_ids"].shape[1]
    tool_turns = 0
    for row in range(len(output)):
        valid = output.batch["attention_mask"][row].bool()
        prompt_ids = output.batch["input_ids"][row][:width][valid[:width]].tolist()
        used = int(output.batch["response_mask"][row].sum())
        response = output.batch["responses"][row][:used].tolist()
        loss = output.batch["loss_mask"][row][:used].tolist()
        turns = [(value, decode(response[a:b])) for value, a, b in runs(loss)]
        prompt_text = decode(prompt_ids)
        user_images = prompt_text.count("<|image_pad|>")
        ended = output.non_tensor_batch["termination_reason"][row]
        messages = conversation(prompt_text, turns, user_images)
        rendered = fm.processor.apply_chat_template(messages, tools=list(TOOLS), tokenize=False,
                                                    add_generation_prompt=not turns or turns[-1][0] == 0)
        ours = prompt_text + "".join(text for _, text in turns)
        if ended in ("answered", "max_turns"):  # the last turn ended with its end-of-turn token
            assert rendered == ours + "\n", (row, ours[-200:], rendered[-200:])
        else:
            assert rendered.startswith(ours[: ours.rfind("<|im_start|>assistant\n")]), row
        # Token for token where the model did not sample: every tool turn is the template's.
        offset = len(prompt_text)
        for sampled, text in turns:
            if not sampled and text.endswith("<|im_start|>assistant\n"):
                expected = tok.encode(rendered[offset: offset + len(text)], add_special_tokens=False)
                assert PADS.sub("<|image_pad|>", tok.decode(expected)) == text
                tool_turns += 1
            offset += len(text)
        # Sampled tokens are exactly the loss positions: each sampled turn ends at its end of turn,
        # and every masked run is a whole tool turn.
        for value, a, b in runs(loss):
            if value and b < used:
                assert response[b - 1] == tok.convert_tokens_to_ids("<|im_end|>"), row
        assert not sample_images(output, row) or user_images + sum(t.count("<|image_pad|>") for s, t in turns if not s) \
            == len(sample_images(output, row))
    assert tool_turns > 0 and output.meta_info["metrics"]["rollout/searches"] > 0


def test_a_dropped_separator_would_be_caught(native):
    """The oracle's own check: the same episode with the newline after one sampled end of turn
    removed no longer equals the template's rendering."""
    fm, prompts, outputs = native
    output = outputs["sync"]
    tok = fm.processor.tokenizer
    width = prompts.batch["input_ids"].shape[1]
    for row in range(len(output)):
        used = int(output.batch["response_mask"][row].sum())
        loss = output.batch["loss_mask"][row][:used].tolist()
        if 0 not in loss or output.non_tensor_batch["termination_reason"][row] != "answered":
            continue
        valid = output.batch["attention_mask"][row].bool()
        prompt_text = tok.decode(output.batch["input_ids"][row][:width][valid[:width]].tolist(), skip_special_tokens=False)
        turns = [(v, tok.decode(output.batch["responses"][row][a:b].tolist(), skip_special_tokens=False))
                 for v, a, b in runs(loss)]
        first_tool = next(i for i, (v, _) in enumerate(turns) if not v)
        assert turns[first_tool][1].startswith("\n")
        broken = list(turns)
        broken[first_tool] = (0, turns[first_tool][1][1:])
        user_images = prompt_text.count(IMAGE)
        rendered = fm.processor.apply_chat_template(conversation(prompt_text, broken, user_images), tools=list(TOOLS),
                                                    tokenize=False)
        assert rendered != prompt_text + "".join(t for _, t in broken) + "\n"
        return
    pytest.fail("no answered episode with a tool turn to break")


def test_the_reward_scores_native_episodes_like_tag_episodes(native):
    """The reward reads the response as EasyR1's reward manager decodes it (special tokens
    skipped): an answered episode whose calls all ran is well formed, and its answer is the one
    its last turn wrote, never text from a tool response."""
    from vrag_rollout.core.reward import format_score, last_answer
    from vrag_rollout.core.tool_turns import final_answer

    fm, _, outputs = native
    output, tok = outputs["sync"], fm.processor.tokenizer
    scored = 0
    for row in range(len(output)):
        used = int(output.batch["response_mask"][row].sum())
        response = tok.decode(output.batch["responses"][row][:used].tolist(), skip_special_tokens=True)
        answered = output.non_tensor_batch["termination_reason"][row] == "answered"
        if answered and "error:" not in response and "<answer>" in response:
            last_turn = tok.decode(output.batch["responses"][row][:used].tolist(), skip_special_tokens=False)
            last_turn = last_turn.rsplit("<|im_start|>assistant\n", 1)[-1]
            assert format_score(response) == 1.0, response[-300:]
            assert last_answer(response) == final_answer(last_turn)
            scored += 1
    assert scored > 0


def test_the_live_guard_finds_no_bad_sample_in_native_batches(native):
    """No false alarm: the guard (every check, positions on every sample) passes these clean
    batches of every family in the tool_call format, in both schedules."""
    from vrag_rollout.devkit.demo import demo_config, demo_page_band
    from vrag_rollout.verify.guard import Guard

    fm, _, outputs = native
    config = demo_config(**demo_page_band(fm.processor), n=2, action_format="tool_call", prompt_length=1024)
    guard = Guard(fm.model_dir, positions_fraction=1.0)
    for mode, output in outputs.items():
        report = guard.inspect(output, config)
        assert report.ok and len(report.positions_checked) == len(output), (mode, report.lines())
