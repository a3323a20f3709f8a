"""The `tags` action format: VRAG/ALDEN actions written inside one assistant turn.

The policy writes `<search>query</search>`, `<fetch>image, N</fetch>` / `<fetch>text, N</fetch>`
(with the region action, `<crop>N, [box]</crop>` or `<bbox>[box]</bbox>`) or `<answer>…</answer>`;
a turn stops at the closing tag of an action (`core.actions.parse_action` reads it) and the
results come back inside `<result>…</result>` in the same assistant turn (`core.step`).

Everything about the format is here: its instructions, stops, prompt (no tool schemas), the
grammar a random model is held to (`regex_*`), and the per-turn work the driver asks of it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ..core import step
from ..core.actions import REGION_STOPS, TOOL_STOPS, ToolCall
from ..core.episode import Episode
from ..core.regions import RELATIVE_1000
from ..core.scope import call_document
from .base import FormatBase
from .region_requests import resolved

INSTRUCTIONS = (
    "Answer the question about the document using its pages. "
    "To search the document write <search>a short query</search>. "
    "To read one page write <fetch>image, N</fetch> or <fetch>text, N</fetch> (pages start at 1). "
    "Results come back inside <result></result>. "
    "Think inside <think></think> and give the final answer inside <answer></answer>."
)
CORPUS_INSTRUCTIONS = (
    "Answer the question using the pages of a document collection. "
    "To search the whole collection write <search>a short query</search>. "
    "To read one page write <fetch>image, N</fetch> or <fetch>text, N</fetch>: page N (pages start at 1) "
    "of the document of the last page shown. "
    "Results come back inside <result></result>. "
    "Think inside <think></think> and give the final answer inside <answer></answer>."
)
REGION_INSTRUCTIONS = (" To look closer at a region of a page shown as an image write <crop>N, [x1, y1, x2, y2]</crop> "
                       "(the box in your grounding coordinates on that image); the region comes back enlarged.")


class TagFormat(FormatBase):
    name = "tags"
    instructions = INSTRUCTIONS
    corpus_instructions = CORPUS_INSTRUCTIONS
    region_instructions = REGION_INSTRUCTIONS
    # The prompt shows no tool schemas: the instructions teach the tags.
    renders_tools = False
    banned_token_ids: tuple[int, ...] = ()

    # ---- what a prompt and a run's settings need (no instance; `instructions_for` from FormatBase) ----
    @staticmethod
    def prompt_tools(config: Any) -> Optional[tuple[dict, ...]]:
        return None

    @staticmethod
    def prompt_template(config: Any) -> Optional[str]:
        """The chat template prompts are rendered with: the tokenizer's own."""
        return None

    @staticmethod
    def stop_strings_for(config: Any) -> tuple[str, ...]:
        return TOOL_STOPS + (REGION_STOPS if getattr(config, "region_action", False) else ())

    # ---- the grammar of a turn (regular expressions for constrained decoding) ----
    call_prefix = ""  # what comes between a turn's thought and its action

    @staticmethod
    def regex_search(query: str) -> str:
        return f"<search>({query})</search>"

    @staticmethod
    def regex_fetch(pages: str, modes: str = "(image|text)") -> str:
        return f"<fetch>{modes}, {pages}</fetch>"

    @staticmethod
    def regex_crop(boxes: str) -> str:
        """A look closer at the last page shown."""
        return f"<bbox>({boxes})</bbox>"

    @staticmethod
    def regex_turn(thought: str, calls: Sequence[str], answer: Optional[str]) -> str:
        """A thought, then one action: one of `calls`, or the answer."""
        return thought + "(" + "|".join([*calls, *([answer] if answer else [])]) + ")"

    # ---- the per-turn work of a run ----
    def __init__(self, config: Any, tokenizer: Any, grounding_frame: str = RELATIVE_1000):
        self.fetch_modes = config.fetch_modes
        self.regions = bool(getattr(config, "region_action", False))
        self.frame = grounding_frame

    def check_prompts(self, prompt_ids: Sequence[Sequence[int]], tokenizer: Any) -> None:
        """Nothing to check: the tags are taught by the prompt's own instructions."""

    def after_generation(self, episode: Episode, output: Any, *, last_turn: bool, observations: Any) -> Any:
        return step.after_generation(episode, output, last_turn=last_turn, fetch_modes=self.fetch_modes,
                                     observations=observations, regions=self.regions)

    def requests(self, calls: list) -> list[ToolCall]:
        sent = [(episode, resolved(action, episode, self.frame)) for episode, action in calls]
        return [ToolCall(i, action, call_document(action, episode.doc_id, episode.page_ids))
                for i, (episode, action) in enumerate(sent)]

    def regroup(self, calls: list, outcomes: list) -> list:
        return outcomes

    def observe(self, observer: Any, calls: list, outcomes: list, room: list) -> list:
        """`observer`: the run's `rollout.tools.Observer` (this layer sits below the rollout)."""
        return observer.observe_turn([(action, outcome, space)
                                      for (_, action), outcome, space in zip(calls, outcomes, room)])
