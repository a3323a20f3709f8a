"""Action formats: one module per format, owning everything that differs between formats.

A caller looks its format up once (`format_named(config.action_format)`) and asks it; nothing
outside this package compares a format's name. A format is one class, used two ways:
- without an instance, for what prompts and a run's settings need: `instructions_for`,
  `prompt_tools`, `prompt_template`, `renders_tools`, `stop_strings_for`, and the grammar of a
  turn for constrained decoding (`regex_search`, `regex_fetch`, `regex_crop`, `regex_turn`);
- as the driver's per-turn object (`format(config, tokenizer, grounding_frame)`):
  `after_generation` is the format's step (`core.step`), `requests` and `regroup` map a batch
  of calls to flat retriever requests and back, `observe` builds each call's observation
  within the room its episode had (it may run in a tool thread: it reads no episode).
A third format is one new module here and one entry in `FORMATS`.

Rule (tests/test_layers.py): imports only `core/` and the top-level leaves, so the light
commands (dataset conversion, the preflight checks) can ask a format without loading torch.

- `tags`: `TagFormat`, VRAG/ALDEN tags inside one assistant turn, results in `<result>` blocks.
- `tool_call`: `ToolCallFormat`, the model's own chat-template tool calls and tool turns.
- `base`: `FormatBase`, what every format shares (its instructions with the region action's).
- `region_requests`: a region action resolved against what its episode was shown (both formats).
"""

from __future__ import annotations

from typing import Union

from ..config import ACTION_FORMATS
from .tags import TagFormat
from .tool_call import ToolCallFormat

ActionFormat = Union[type[TagFormat], type[ToolCallFormat]]
FORMATS: dict[str, ActionFormat] = {fmt.name: fmt for fmt in (TagFormat, ToolCallFormat)}


def format_named(name: str) -> ActionFormat:
    """The format class called `name` (a config's `action_format`)."""
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        raise ValueError(f"action_format must be one of {ACTION_FORMATS}, got {name!r}") from None


__all__ = ["FORMATS", "ActionFormat", "TagFormat", "ToolCallFormat", "format_named"]
