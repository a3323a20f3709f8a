"""Action formats: everything the rollout does differently per format, in one object each.

A format is looked up once, when the rollout is built (`FORMATS[config.action_format]`), and
the rollout and its schedules call it without asking which one it is. A third format is one new
class here and one entry in `FORMATS`.

- `TagFormat` (`tags`): VRAG/ALDEN actions inside one assistant turn (`<search>`, `<fetch>`),
  results as `<result>` blocks; a turn stops at the closing tag of an action.
- `ToolCallFormat` (`tool_call`): the model's own chat-template tool calls; a turn ends with its
  end-of-turn token, its calls run in order and come back as one tool turn rendered by the
  template (`core.tool_turns`).

Contract: `after_generation` is the format's per-turn step (`core.step`), `requests` and
`regroup` map a batch of calls to flat retriever requests and back, `observe` builds each call's
observation within the room its episode had (it may run in a tool thread: it reads no episode).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..core import step
from ..core.actions import REGION_STOPS, TOOL_STOPS, Crop, Fetch, Search
from ..core.regions import RELATIVE_1000, RegionError, resolve
from ..core.episode import Episode
from ..core.tool_turns import ToolTurnTemplate, tools_for
from .tools import Observer, ToolCall


class TagFormat:
    name = "tags"
    banned_token_ids: tuple[int, ...] = ()

    @staticmethod
    def stop_strings_for(config: Any) -> tuple[str, ...]:
        return TOOL_STOPS + (REGION_STOPS if getattr(config, "region_action", False) else ())

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
        return [ToolCall(i, _resolved(action, episode, self.frame), episode.doc_id)
                for i, (episode, action) in enumerate(calls)]

    def regroup(self, calls: list, outcomes: list) -> list:
        return outcomes

    def observe(self, observer: Observer, calls: list, outcomes: list, room: list) -> list:
        return observer.observe_turn([(action, outcome, budget, slots)
                                      for (_, action), outcome, (budget, slots) in zip(calls, outcomes, room)])


class ToolCallFormat:
    name = "tool_call"

    @staticmethod
    def stop_strings_for(config: Any) -> tuple[str, ...]:
        return ()  # a turn ends with its end-of-turn token

    def __init__(self, config: Any, tokenizer: Any, grounding_frame: str = RELATIVE_1000):
        template = _read_template(config.chat_template) if config.chat_template else None
        self.regions = bool(getattr(config, "region_action", False))
        self.frame = grounding_frame
        self.template = ToolTurnTemplate(tokenizer, tools_for(config), chat_template=template)
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
        return [ToolCall(0, _resolved(call, episode, self.frame, turn.calls[:k]), episode.doc_id)
                for episode, turn in calls for k, call in enumerate(turn.calls) if isinstance(call, _SENT)]

    def regroup(self, calls: list, outcomes: list) -> list:
        """The flat outcomes back per turn, in call order (None for an invalid call)."""
        flat = iter(outcomes)
        return [[next(flat) if isinstance(call, _SENT) else None for call in turn.calls]
                for _, turn in calls]

    def observe(self, observer: Observer, calls: list, outcomes: list, room: list) -> list:
        return [observer.observe_tool_turn(turn.calls, outs, budget, slots, self.template)
                for (_, turn), outs, (budget, slots) in zip(calls, outcomes, room)]


FORMATS = {fmt.name: fmt for fmt in (TagFormat, ToolCallFormat)}
_SENT = (Search, Fetch, Crop)  # the calls that reach the retriever (or its refusal of a region)


def _resolved(action: Any, episode: Episode, frame: str, earlier_calls: Sequence[Any] = ()) -> Any:
    """A region action resolved against what its episode was shown (a `RegionRequest`, or the
    `RegionError` to answer it with); other actions as they are. `earlier_calls`: the calls
    before it in the same turn, whose pages it cannot use yet (the error says so)."""
    if not isinstance(action, Crop):
        return action
    try:
        return resolve(action.page, action.box, frame, episode.doc_id, episode.shown_pages, episode.last_page_id)
    except RegionError as error:
        if any(isinstance(c, Search) or (isinstance(c, Fetch) and c.modality == "image") for c in earlier_calls):
            return RegionError(f"{error}; a page this turn's own calls show can be cropped from the next turn on")
        return error


def _read_template(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as e:
        raise ValueError(f"chat_template {path!r} cannot be read as a template file: {e}") from e
