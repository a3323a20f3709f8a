"""The native tool-call format: the two tools, reading a turn's calls, and the tokens of a tool turn
derived from the model's own chat template (pure, given a tokenizer).

After the policy samples an assistant turn that ends with `<|im_end|>` and holds tool calls, the
observation is exactly what the chat template renders between that assistant message and the next
generation prompt: the turn separator, the header of the turn that carries tool results, each
result in its wrappers (pages as `<|vision_start|><|image_pad|><|vision_end|>`, one pad per image),
and the next assistant header. Nothing is typed in per family: `ToolTurnTemplate` renders the
conversation with and without the tool turn and keeps the difference, and refuses a template that
cannot render a tool turn after an assistant turn without rewriting it. The observation text starts
right after the sampled `<|im_end|>`, a special token, so tokenizing it alone cannot merge across
the boundary, and the sampled ids are never re-tokenized.

Invariant (tested for every family against `apply_chat_template` of the whole conversation): the
prompt ids, then per turn the sampled ids and the derived observation ids, equal the tokenized
rendering of the conversation at every position.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

from .actions import MAX_QUERY_CHARS, Crop, Fetch, Invalid, Search
from .readers import clip, read_box, read_page
from .serial_tokenizer import serial

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the document for pages matching a short query; returns page images.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "a few keywords"}},
            "required": ["query"],
        },
    },
}
FETCH_TOOL = {
    "type": "function",
    "function": {
        "name": "fetch",
        "description": "Read one page of the document, as an image or as its text.",
        "parameters": {
            "type": "object",
            "properties": {
                "page": {"type": "integer", "description": "page number, from 1"},
                "mode": {"type": "string", "enum": ["image", "text"]},
            },
            "required": ["page", "mode"],
        },
    },
}
CROP_TOOL = {
    "type": "function",
    "function": {
        "name": "crop",
        "description": "Look closer at a region of a page shown as an image; returns the region enlarged.",
        "parameters": {
            "type": "object",
            "properties": {
                "page": {"type": "integer", "description": "a page already shown; omitted: the last one"},
                "bbox": {"type": "array", "items": {"type": "number"},
                         "description": "[x1, y1, x2, y2], top left and bottom right, in grounding coordinates"},
            },
            "required": ["bbox"],
        },
    },
}
TOOLS = (SEARCH_TOOL, FETCH_TOOL)
REGION_TOOLS = TOOLS + (CROP_TOOL,)  # with the region action (`region_action=True`)


def tools_for(config: Any) -> tuple[dict, ...]:
    """The tools a run's prompts show and its policy may call."""
    return REGION_TOOLS if getattr(config, "region_action", False) else TOOLS

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_DUMMY_CALL = {"type": "function", "function": {"name": "search", "arguments": {"query": "q"}}}
# Special-token strings inside a tool result (page text) stay text: "<|" never reaches the template.
_SPECIAL_OPEN = "<|"


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def final_answer(text: str) -> str:
    """The answer of a turn without tool calls: its last <answer> block, else its content
    without the reasoning and the end-of-turn token."""
    answers = _ANSWER.findall(text)
    if answers:
        return answers[-1].strip()
    return _THINK.sub("", text).replace("<|im_end|>", "").strip()


def template_with_tools(template: str, tools: Sequence[dict] = TOOLS) -> str:
    """`template` with `tools` as the default of its `tools` variable: rendering it without
    `tools=` gives what the original renders with them (tested for every family). For trainers
    whose dataset renders prompts without `tools=` (EasyR1's), so the system turn is the
    template's own with the schemas in it; a non-empty `tools=` still wins (None or [] get the
    defaults)."""
    if template.startswith(_DEFAULT_TOOLS_MARK):
        template = template[template.index(_DEFAULT_TOOLS_END) + len(_DEFAULT_TOOLS_END):]
    literal = _jinja_literal(list(tools))
    return f"{_DEFAULT_TOOLS_MARK}{{%- if not tools %}}{{%- set tools = {literal} %}}{{%- endif %}}{_DEFAULT_TOOLS_END}{template}"


_DEFAULT_TOOLS_MARK = "{#- vrag-rollout: default tools -#}"
_DEFAULT_TOOLS_END = "{#- end of default tools -#}"


def _jinja_literal(value: Any) -> str:
    """A Jinja expression for a JSON value (Jinja spells true, false and none in lower case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_jinja_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_jinja_literal(v) for v in value) + "]"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


class TemplateError(ValueError):
    """A chat template that cannot render a tool turn the way an append-only rollout needs."""


@dataclass(frozen=True)
class ToolCalls:
    """The calls of one assistant turn, in order (invalid ones included: each gets its answer)."""

    calls: tuple


def parse_tool_calls(text: str, regions: bool = False) -> list[Union[Search, Fetch, Crop, Invalid]]:
    """Every `<tool_call>` block of an assistant turn, in order, as an action or the reason it
    cannot be executed (invalid JSON, unknown tool, missing or ill-typed arguments, a block never
    closed). Text before the first block is the turn's content (its reasoning) and is not read;
    text after the last closed block is a mistake: the calls still run, and one more error answer
    says the text was ignored (a chat message holds content, then its calls). `crop` is a tool
    only with `regions` (the region action). Never raises, whatever the text: JSON the parser
    cannot hold (nesting past the recursion limit, integers past `int()`'s digit limit) is
    invalid JSON, and arguments are read through `readers` (an int past the float range in a box
    is a bad region, not an OverflowError)."""
    calls: list[Union[Search, Fetch, Crop, Invalid]] = []
    bodies = _CALL.findall(text)
    for body in bodies:
        calls.append(_read_call(body, regions))
    if has_open_call(text):
        calls.append(Invalid("a <tool_call> was not closed with </tool_call>.", "unclosed_call"))
    elif bodies:
        after = text[text.rfind("</tool_call>") + len("</tool_call>"):].replace("<|im_end|>", "")
        if after.strip():
            calls.append(Invalid("text after </tool_call> was ignored; end the turn after the last call.",
                                 "text_after_call"))
    return calls


def has_open_call(text: str) -> bool:
    """Whether a `<tool_call>` of the turn was never closed."""
    return text.count("<tool_call>") > len(_CALL.findall(text))


def _read_call(body: str, regions: bool = False) -> Union[Search, Fetch, Crop, Invalid]:
    call = _load_json(body)
    if isinstance(call, Invalid):
        return call
    if not isinstance(call, dict) or not isinstance(call.get("arguments"), dict):
        return Invalid('write {"name": ..., "arguments": {...}} inside <tool_call></tool_call>.', "bad_call_shape")
    name, args = call.get("name"), call["arguments"]
    if name == "search":
        return _read_search(args)
    if name == "fetch":
        page, mode = read_page(args.get("page")), args.get("mode")
        if page is None or mode not in ("image", "text"):
            return Invalid("fetch needs an integer 'page' from 1 and 'mode' image or text.", "bad_arguments")
        return Fetch(mode, page)
    if name == "crop" and regions:
        return _read_crop(args)
    tools = "search, fetch and crop" if regions else "search and fetch"
    shown = repr(clip(name)) if isinstance(name, str) else clip(name)
    return Invalid(f"unknown tool {shown}; the tools are {tools}.", "unknown_tool")


def _load_json(body: str) -> Any:
    """The call's JSON value, or why it is not one (as the Invalid answer)."""
    try:
        return json.loads(body)
    except json.JSONDecodeError as e:
        reason = e.msg
    except ValueError:  # an integer literal past int()'s digit limit (4300 digits)
        reason = "a number has too many digits"
    except RecursionError:  # arrays or objects nested past the recursion limit
        reason = "nested too deeply"
    return Invalid(f"the tool call is not valid JSON ({reason}).", "invalid_json")


def _read_search(args: dict) -> Union[Search, Invalid]:
    query = args.get("query")
    if not (isinstance(query, str) and query.strip()):
        return Invalid("search needs a non-empty string 'query'.", "bad_arguments")
    if len(query.strip()) > MAX_QUERY_CHARS:
        return Invalid(f"the search query is longer than {MAX_QUERY_CHARS} characters.", "long_query")
    if not _is_utf8(query):  # a lone surrogate, written as a JSON escape: no retriever can take it
        return Invalid("the search query is not valid unicode text.", "bad_arguments")
    return Search(query.strip())


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _read_crop(args: dict) -> Union[Crop, Invalid]:
    page, box = args.get("page"), read_box(args.get("bbox"))
    usage = "crop needs 'bbox' [x1, y1, x2, y2] of four finite numbers and, if given, an integer 'page' from 1."
    if page is not None and read_page(page) is None:
        return Invalid(usage, "bad_arguments")
    if box is None:
        return Invalid(usage, "bad_region")
    return Crop(page, box)


@dataclass(frozen=True)
class ToolResult:
    """One tool message: `images` page images, then a text."""

    text: str
    images: int = 0

    def message(self) -> dict:
        content = [{"type": "image"} for _ in range(self.images)]
        content.append({"type": "text", "text": self.text.replace(_SPECIAL_OPEN, "<")})
        return {"role": "tool", "content": content}


class ToolTurnTemplate:
    """Tool-turn observation tokens derived from a chat template (the tokenizer's own, or one
    given), for a fixed tool list."""

    def __init__(self, tokenizer: Any, tools: Sequence[dict] = TOOLS, chat_template: Optional[str] = None):
        self.tokenizer = serial(tokenizer)  # called from the rollout's tool threads
        self.tools = list(tools)
        self.chat_template = chat_template
        self.end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self._base = [{"role": "user", "content": "q"},
                      {"role": "assistant", "content": "a", "tool_calls": [_DUMMY_CALL]}]
        # Refuse an unusable template now, not mid-rollout.
        system = self._render(self._base[:1], generation_prompt=True)
        if any(json.dumps(tool["function"]["name"]) not in system for tool in self.tools):
            raise TemplateError("the chat template ignores tools= (no tool schemas in the system turn): "
                                "use the tags action format or give a template with tool rules")
        # How a prompt shows it carries the schemas: each tool's JSON as the template wrote it,
        # else (a template that reformats them) its quoted name.
        schemas = [json.dumps(tool, ensure_ascii=False) for tool in self.tools]
        self._schema_marks = schemas if all(mark in system for mark in schemas) else [
            json.dumps(tool["function"]["name"]) for tool in self.tools]
        # The conversation before the tool turn is the same for every turn: render it once.
        before = self._render(self._base, generation_prompt=False)
        self._cut = before.rfind("<|im_end|>") + len("<|im_end|>")
        if self._cut < len("<|im_end|>"):
            raise TemplateError("the chat template does not end an assistant turn with <|im_end|>")
        self._before = before[: self._cut]
        self.observation_text([ToolResult("probe", images=1)])

    def missing_tools(self, prompt_text: str) -> list[str]:
        """Names of the tools whose schema the rendered prompt lacks (a prompt rendered without
        `tools=`: the policy would be asked to call tools it was never shown)."""
        return [tool["function"]["name"] for tool, mark in zip(self.tools, self._schema_marks)
                if mark not in prompt_text]

    def _render(self, messages: list, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=generation_prompt,
            chat_template=self.chat_template,
        )

    def observation_text(self, results: Sequence[ToolResult]) -> str:
        """What the template renders after the assistant turn's `<|im_end|>` up to the next
        generation prompt, for these tool results (in order)."""
        after = self._render(self._base + [r.message() for r in results], generation_prompt=True)
        if not after.startswith(self._before):
            raise TemplateError("the chat template rewrites the assistant turn when a tool turn follows it; "
                                "a rollout that appends tokens cannot follow it (give a template that does)")
        text = after[self._cut:]
        position = 0
        for result in results:
            found = text.find(result.message()["content"][-1]["text"], position)
            if found < 0:
                raise TemplateError("the chat template does not render tool messages (no tool rules): "
                                    "use the tags action format or give a template with tool rules")
            position = found
        return text

    def observation_ids(self, results: Sequence[ToolResult]) -> list[int]:
        """The engine view: one `<|image_pad|>` per image, as the template writes it."""
        return self.tokenizer.encode(self.observation_text(results), add_special_tokens=False)
