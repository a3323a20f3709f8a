"""The `tool_call` action format: the model's own chat-template tool calls.

The prompt's system turn carries the tool schemas (`core.tool_turns.tools_for`), rendered by the
chat template; the policy writes `<tool_call>{json}</tool_call>` blocks and a turn ends with its
end-of-turn token (`core.step.after_tool_call_turn` reads it). Its calls run in order and come
back as one tool turn rendered by the template (`core.tool_turns.ToolTurnTemplate`); a turn
without calls gives the answer inside `<answer>…</answer>`.

Everything about the format is here: its instructions, stops, prompt tools and template, the
grammar a random model is held to (`regex_*`), and the per-turn work the driver asks of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from ..core import step
from ..core.actions import Crop, Fetch, Search, ToolCall
from ..core.episode import Episode
from ..core.regions import RELATIVE_1000
from ..core.scope import call_document
from ..core.tool_turns import ToolTurnTemplate, tools_for
from .base import FormatBase
from .region_requests import resolved

INSTRUCTIONS = (
    "Answer the question about the document using its pages. Call search to find pages and fetch "
    "to read one page (pages start at 1). Think inside <think></think> and give the final answer, "
    "without a tool call, inside <answer></answer>."
)
CORPUS_INSTRUCTIONS = (
    "Answer the question using the pages of a document collection. Call search to find pages in the whole "
    "collection and fetch to read one page (pages start at 1) of the document of the last page shown. Think "
    "inside <think></think> and give the final answer, without a tool call, inside <answer></answer>."
)
REGION_INSTRUCTIONS = " Call crop to look closer at a region of a page shown as an image."

_SENT = (Search, Fetch, Crop)  # the calls that reach the retriever (or its refusal of a region)


class ToolCallFormat(FormatBase):
    name = "tool_call"
    instructions = INSTRUCTIONS
    corpus_instructions = CORPUS_INSTRUCTIONS
    region_instructions = REGION_INSTRUCTIONS
    # Prompts and tool turns are rendered by the chat template, with the tool schemas: a run's
    # prompts and its rollout must use one template.
    renders_tools = True

    # ---- what a prompt and a run's settings need (no instance; `instructions_for` from FormatBase) ----
    @staticmethod
    def prompt_tools(config: Any) -> Optional[tuple[dict, ...]]:
        return tools_for(config)

    @staticmethod
    def prompt_template(config: Any) -> Optional[str]:
        """The chat template prompts are rendered with: `config.chat_template`'s, else the tokenizer's own."""
        return read_template(config.chat_template) if config.chat_template else None

    @staticmethod
    def stop_strings_for(config: Any) -> tuple[str, ...]:
        return ()  # a turn ends with its end-of-turn token

    # ---- the grammar of a turn (regular expressions for constrained decoding) ----
    call_prefix = r"\n"  # what comes between a turn's thought and each call

    @staticmethod
    def regex_search(query: str) -> str:
        return r'<tool_call>\n\{"name": "search", "arguments": \{"query": "(' + query + r')"\}\}\n</tool_call>'

    @staticmethod
    def regex_fetch(pages: str, modes: str = "(image|text)") -> str:
        return (r'<tool_call>\n\{"name": "fetch", "arguments": \{"page": ' + pages
                + r', "mode": "' + modes + r'"\}\}\n</tool_call>')

    @staticmethod
    def regex_crop(boxes: str) -> str:
        """A look closer at the last page shown (the `crop` tool without a page)."""
        return r'<tool_call>\n\{"name": "crop", "arguments": \{"bbox": (' + boxes + r')\}\}\n</tool_call>'

    @classmethod
    def regex_turn(cls, thought: str, calls: Sequence[str], answer: Optional[str]) -> str:
        """A thought, then one or two of `calls` as the chat template writes them, or the answer;
        the grammar's end leaves only the end-of-turn token."""
        call = "(" + "|".join(calls) + ")"
        answer_branch = "|" + answer if answer else ""
        return f"{thought}({cls.call_prefix}{call}({cls.call_prefix}{call})?{answer_branch})"

    # ---- the per-turn work of a run ----
    def __init__(self, config: Any, tokenizer: Any, grounding_frame: str = RELATIVE_1000):
        self.regions = bool(getattr(config, "region_action", False))
        self.frame = grounding_frame
        self.template = ToolTurnTemplate(tokenizer, tools_for(config), chat_template=self.prompt_template(config))
        self.turn_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        # The only EOS the chat format continues after is the end of turn: ban the other one.
        other_eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        self.banned_token_ids = (other_eos,) if isinstance(other_eos, int) and other_eos != self.turn_end else ()

    def check_prompts(self, prompt_ids: Sequence[Sequence[int]], tokenizer: Any) -> None:
        """Tool calls from a prompt that never showed the tools would train the policy on a
        conversation no deployment has: refuse it."""
        for row, ids in enumerate(prompt_ids):
            missing = self.template.missing_tools(tokenizer.decode(list(ids), skip_special_tokens=False))
            if missing:
                raise ValueError(
                    f"action_format='tool_call', but prompt {row} does not "
                    f"carry the schemas of {missing} in its system turn: render prompts with tools= "
                    "(vrag_rollout.core.tool_turns.tools_for(config)); EasyR1 runs started with `python -m "
                    "vrag_rollout.integrations.easyr1` do this for its dataset (docs/easyr1.md)")

    def after_generation(self, episode: Episode, output: Any, *, last_turn: bool, observations: Any) -> Any:
        return step.after_tool_call_turn(episode, output, last_turn=last_turn, turn_end=self.turn_end,
                                         regions=self.regions)

    def requests(self, calls: list) -> list[ToolCall]:
        """Every valid call of every turn, flat (invalid ones are never sent); a crop resolved
        against the pages its episode was shown before this turn (the turn's own results come
        back together, after it)."""
        sent = [(episode, resolved(call, episode, self.frame, turn.calls[:k]))
                for episode, turn in calls for k, call in enumerate(turn.calls) if isinstance(call, _SENT)]
        return [ToolCall(0, action, call_document(action, episode.doc_id, episode.page_ids))
                for episode, action in sent]

    def regroup(self, calls: list, outcomes: list) -> list:
        """The flat outcomes back per turn, in call order (None for an invalid call)."""
        flat = iter(outcomes)
        return [[next(flat) if isinstance(call, _SENT) else None for call in turn.calls]
                for _, turn in calls]

    def observe(self, observer: Any, calls: list, outcomes: list, room: list) -> list:
        """`observer`: the run's `rollout.tools.Observer` (this layer sits below the rollout)."""
        return [observer.observe_tool_turn(turn.calls, outs, space, self.template)
                for (_, turn), outs, space in zip(calls, outcomes, room)]


def read_template(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"chat_template {path!r} cannot be read as a template file: {e}") from e
