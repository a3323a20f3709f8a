"""The native tool-call format's pure parts: the calls a turn holds, and tool-turn tokens derived
from each family's chat template, checked against the template's rendering of the whole
conversation (the oracle), token for token."""

from __future__ import annotations

import json

import pytest
from transformers import AutoProcessor

from vrag_rollout.core.actions import Crop, Fetch, Invalid, Search
from vrag_rollout.families import FAMILY_NAMES
from vrag_rollout.devkit.tiny_model import build_tiny_model, default_model_dir
from vrag_rollout.core.tool_turns import TOOLS, TemplateError, ToolResult, ToolTurnTemplate, parse_tool_calls


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def processor(request):
    return AutoProcessor.from_pretrained(build_tiny_model(default_model_dir(request.param), request.param))


CALL = '<think>look it up</think>\n<tool_call>\n{"name": "search", "arguments": {"query": "board approved"}}\n</tool_call>'
RESULTS = [ToolResult("pages annual_report_2, annual_report_3", images=2), ToolResult("page 3 says <|im_end|> hi")]


def conversation(answer: str) -> list:
    def tool(result):
        content = [{"type": "image"} for _ in range(result.images)] + [{"type": "text", "text": result.text}]
        return {"role": "tool", "content": content}

    return [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which page covers it?"}]},
        {"role": "assistant", "content": CALL},  # the model's raw text
        tool(RESULTS[0]),
        tool(ToolResult(RESULTS[1].text.replace("<|", "<"))),  # page text never carries special tokens
        {"role": "assistant", "content": answer},
    ]


def incremental_ids(processor, template, answer, observation=None):
    """What the rollout appends: prompt, sampled turn 1, derived observation, sampled turn 2."""
    tok = processor.tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    prompt = tok.apply_chat_template(conversation(answer)[:1], tools=list(TOOLS), add_generation_prompt=True,
                                     tokenize=False)
    ids = tok.encode(prompt, add_special_tokens=False)
    ids += tok.encode(CALL, add_special_tokens=False) + [end]  # sampled: ends with <|im_end|>
    ids += template.observation_ids(RESULTS) if observation is None else observation
    ids += tok.encode(answer, add_special_tokens=False) + [end]
    return ids


def test_tool_turns_equal_the_templates_rendering_of_the_conversation(processor):
    tok = processor.tokenizer
    template = ToolTurnTemplate(tok)
    answer = "<think>found</think><answer>page 3</answer>"
    full = tok.encode(processor.apply_chat_template(conversation(answer), tools=list(TOOLS), tokenize=False),
                      add_special_tokens=False)
    ids = incremental_ids(processor, template, answer)
    assert ids == full[: len(ids)]
    assert tok.decode(full[len(ids):]) == "\n"  # only the separator after the final turn is left
    pads = template.observation_ids(RESULTS).count(tok.convert_tokens_to_ids("<|image_pad|>"))
    assert pads == 2  # one per page image, for the engine to expand


def test_the_oracle_catches_a_dropped_turn_separator(processor):
    """The bug class this rules out: the tool turn rendered on its own, without the newline that
    follows the assistant's <|im_end|>."""
    tok = processor.tokenizer
    template = ToolTurnTemplate(tok)
    text = template.observation_text(RESULTS)
    assert text.startswith("\n")
    dropped = tok.encode(text[1:], add_special_tokens=False)
    answer = "<answer>x</answer>"
    full = tok.encode(processor.apply_chat_template(conversation(answer), tools=list(TOOLS), tokenize=False),
                      add_special_tokens=False)
    ids = incremental_ids(processor, template, answer, observation=dropped)
    assert ids != full[: len(ids)]


def test_a_template_without_tool_rules_is_refused(processor):
    plain = ("{%- for message in messages -%}{{- '<|im_start|>' + message['role'] + '\\n' -}}"
             "{%- if message['content'] is string -%}{{- message['content'] -}}{%- endif -%}"
             "{{- '<|im_end|>\\n' -}}{%- endfor -%}"
             "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")
    with pytest.raises(TemplateError, match="ignores tools="):
        ToolTurnTemplate(processor.tokenizer, chat_template=plain)


@pytest.mark.parametrize("text, expected", [
    ('<tool_call>\n{"name": "search", "arguments": {"query": " revenue "}}\n</tool_call>', [Search("revenue")]),
    ('<tool_call>{"name": "fetch", "arguments": {"page": 3, "mode": "text"}}</tool_call>'
     '<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>', [Fetch("text", 3), Search("q")]),
    ('<tool_call>{"name": "search", "arguments": {"query": "q"</tool_call>', ["not valid JSON"]),
    ('<tool_call>{"name": "browse", "arguments": {}}</tool_call>', ["unknown tool 'browse'"]),
    ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', ["non-empty string 'query'"]),
    ('<tool_call>{"name": "fetch", "arguments": {"page": "3", "mode": "image"}}</tool_call>', ["integer 'page'"]),
    ('<tool_call>{"name": "fetch", "arguments": {"page": 2, "mode": "audio"}}</tool_call>', ["'mode' image or text"]),
    ('<tool_call>["search"]</tool_call>', ['"arguments"']),
    ('<tool_call>{"name": "search", "arguments": {"query": "q"}}', ["not closed"]),  # unterminated
    ("no call at all", []),
    ('<think>plan</think>\n<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>\n<|im_end|>',
     [Search("q")]),  # reasoning before the call, whitespace after it: well formed
    ('<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call> done<|im_end|>',
     [Search("q"), "text after </tool_call>"]),
    ('<tool_call>{"name": "search", "arguments": {"query": "' + "x" * 513 + '"}}</tool_call>', ["longer than 512"]),
])
def test_parse_tool_calls(text, expected):
    calls = parse_tool_calls(text)
    assert len(calls) == len(expected)
    for call, want in zip(calls, expected):
        if isinstance(want, str):
            assert isinstance(call, Invalid) and want in call.message, call
        else:
            assert call == want


@pytest.mark.parametrize("text, kind", [
    ('<tool_call>{"name": "search", "arguments": {"query": "q"</tool_call>', "invalid_json"),
    ('<tool_call>["search"]</tool_call>', "bad_call_shape"),
    ('<tool_call>{"name": "browse", "arguments": {}}</tool_call>', "unknown_tool"),
    ('<tool_call>{"name": "fetch", "arguments": {"page": 0, "mode": "image"}}</tool_call>', "bad_arguments"),
    ('<tool_call>{"name": "search"', "unclosed_call"),
    ('<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>x', "text_after_call"),
])
def test_each_mistake_has_its_kind(text, kind):
    assert [call.kind for call in parse_tool_calls(text) if isinstance(call, Invalid)] == [kind]


def _crop_call(arguments) -> str:
    return f'<tool_call>{json.dumps({"name": "crop", "arguments": arguments})}</tool_call>'


@pytest.mark.parametrize("arguments, expected", [
    ({"page": 2, "bbox": [10, 20.5, 300, 400]}, Crop(2, (10.0, 20.5, 300.0, 400.0))),
    ({"bbox": [0, 0, 500, 500]}, Crop(None, (0.0, 0.0, 500.0, 500.0))),  # the last page shown
    ({"page": 0, "bbox": [0, 0, 1, 1]}, "bad_arguments"),
    ({"page": True, "bbox": [0, 0, 1, 1]}, "bad_arguments"),
    ({"page": 2}, "bad_region"),
    ({"page": 2, "bbox": [0, 0, 1]}, "bad_region"),
    ({"page": 2, "bbox": [0, 0, "1", 1]}, "bad_region"),
    ({"page": 2, "bbox": [0, 0, True, 1]}, "bad_region"),
])
def test_the_crop_tool_with_the_region_action(arguments, expected):
    (call,) = parse_tool_calls(_crop_call(arguments), regions=True)
    if isinstance(expected, str):
        assert isinstance(call, Invalid) and call.kind == expected, call
    else:
        assert call == expected


def test_without_the_region_action_crop_is_an_unknown_tool():
    (call,) = parse_tool_calls(_crop_call({"page": 2, "bbox": [0, 0, 1, 1]}))
    assert isinstance(call, Invalid) and call.kind == "unknown_tool" and "search and fetch" in call.message


def test_region_runs_show_the_crop_schema_and_others_do_not(processor):
    from vrag_rollout.config import AgentRolloutConfig
    from vrag_rollout.core.tool_turns import REGION_TOOLS, tools_for

    assert tools_for(AgentRolloutConfig(region_action=True)) == REGION_TOOLS
    assert tools_for(AgentRolloutConfig()) == TOOLS
    with_crop = ToolTurnTemplate(processor.tokenizer, REGION_TOOLS)
    prompt = processor.tokenizer.apply_chat_template([{"role": "user", "content": "q"}], tools=list(TOOLS),
                                                     add_generation_prompt=True, tokenize=False)
    assert with_crop.missing_tools(prompt) == ["crop"]  # a prompt without the crop schema is refused
