"""The action formats are one module each (`vrag_rollout/formats/`): callers ask a format, never
compare its name; a format's grammar writes what its own parser reads; the light commands can ask
a format without loading torch."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vrag_rollout.config import ACTION_FORMATS
from vrag_rollout.core.actions import Fetch, Search, parse_action
from vrag_rollout.core.tool_turns import parse_tool_calls
from vrag_rollout.devkit.demo import turn_regex
from vrag_rollout.devkit.learn_task import task_regex
from vrag_rollout.formats import FORMATS, TagFormat, ToolCallFormat, format_named
from vrag_rollout.turn_output import STOP

ROOT = Path(__file__).resolve().parents[1]


def format_name_comparisons(source: str) -> list[str]:
    """Comparisons (==, !=, is, is not) with an `action_format` operand, as source text."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot))
                                                 for op in node.ops):
            text = ast.unparse(node)
            if "action_format" in text:
                found.append(text)
    return found


def test_no_caller_compares_a_formats_name():
    files = [*(ROOT / "vrag_rollout").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")]
    found = {str(path.relative_to(ROOT)): hits for path in files
             if "formats" not in path.relative_to(ROOT).parts
             for hits in [format_name_comparisons(path.read_text(encoding="utf-8"))] if hits}
    assert found == {}


def test_the_comparison_finder_can_fail():
    assert format_name_comparisons('if config.action_format == "tool_call":\n    pass\n') == [
        "config.action_format == 'tool_call'"]
    assert format_name_comparisons('x = (c or {}).get("action_format") != "tags"\n') != []
    assert format_name_comparisons('if tag == "tool_call":\n    pass\n') == []  # a block's tag, not a format


def test_the_registry_is_the_configs_list_and_an_unknown_name_is_refused():
    assert tuple(FORMATS) == ACTION_FORMATS
    assert format_named("tags") is TagFormat and format_named("tool_call") is ToolCallFormat
    with pytest.raises(ValueError, match=r"action_format must be one of \('tags', 'tool_call'\), got 'json'"):
        format_named("json")


# What a policy writes for "fetch page 3 as an image", in each format, and the action it is.
FETCH_PAGE_3 = {
    "tags": "<fetch>image, 3</fetch>",
    "tool_call": '<tool_call>\n{"name": "fetch", "arguments": {"page": 3, "mode": "image"}}\n</tool_call>',
}


def parsed(action_format: str, text: str) -> list:
    """The actions the format's own parser reads in a turn's text."""
    if format_named(action_format).renders_tools:
        return parse_tool_calls(text)
    return [parse_action(text, STOP, text[text.rindex("</"):])]


@pytest.mark.parametrize("action_format", ACTION_FORMATS)
def test_each_formats_grammar_writes_what_its_parser_reads(action_format):
    """The learn task's grammar admits the fetch the parser reads as Fetch(image, 3), and the
    demo's turn grammar a thought and a search the parser reads as that search."""
    fetch = FETCH_PAGE_3[action_format]
    assert re.fullmatch(task_regex(action_format), fetch)
    assert parsed(action_format, fetch) == [Fetch("image", 3)]
    fmt = format_named(action_format)
    search = fmt.call_prefix.replace(r"\n", "\n") + (
        '<tool_call>\n{"name": "search", "arguments": {"query": "battery life"}}\n</tool_call>'
        if fmt.renders_tools else "<search>battery life</search>")
    turn = "<think>look it up</think>" + search
    assert re.fullmatch(turn_regex(action_format, "battery life", 6, answer=False), turn)
    assert parsed(action_format, turn) == [Search("battery life")]
    assert not re.fullmatch(turn_regex(action_format, "battery life", 6, answer=False),
                            "<think>look it up</think><answer>3</answer>")


def test_prompt_facts_differ_only_through_the_format():
    class Config:
        region_action = True
        chat_template = None

    assert TagFormat.prompt_tools(Config) is None and not TagFormat.renders_tools
    assert [tool["function"]["name"] for tool in ToolCallFormat.prompt_tools(Config)] == ["search", "fetch", "crop"]
    assert TagFormat.instructions_for(True).endswith(TagFormat.region_instructions)
    assert ToolCallFormat.instructions_for(False) == ToolCallFormat.instructions
    assert "</search>" in TagFormat.stop_strings_for(Config) and ToolCallFormat.stop_strings_for(Config) == ()


@pytest.mark.process
def test_asking_a_format_loads_no_torch():
    code = ("import sys, vrag_rollout.formats, vrag_rollout.data.prompts; "
            "print(json.dumps([m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_check_knows_each_format_itself_and_refuses_an_unknown_one():
    """The independent checker keeps its own table of formats (it imports nothing of the
    rollout's): one entry per format, tags when unrecorded, a one-line error for another."""
    from types import SimpleNamespace

    from vrag_rollout.verify.check.report import CheckInputError
    from vrag_rollout.verify.check.runner import LAYOUTS, observation_layout

    assert tuple(LAYOUTS) == ACTION_FORMATS
    assert observation_layout(SimpleNamespace(config=None))[0] is False
    assert observation_layout(SimpleNamespace(config={"action_format": "tool_call"}))[0] is True
    with pytest.raises(CheckInputError, match="action_format 'json' is none this checker knows"):
        observation_layout(SimpleNamespace(config={"action_format": "json"}))
