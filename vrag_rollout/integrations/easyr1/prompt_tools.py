"""Tool schemas in the prompts EasyR1's dataset renders, for `action_format: tool_call` runs.

EasyR1's `RLHFDataset` renders every prompt with `apply_chat_template(messages, ...)` and no
`tools=`, so a tool_call policy would be asked to call tools its prompt never showed (the rollout
refuses such prompts). When the job's environment names the run's template (`PROMPT_TOOLS_ENV`,
set by `ray_env.make_runtime_env` for tool_call configs), the patched dataset gives its tokenizer
and processor that template with the agent's tools as the default of `tools`
(`tool_turns.template_with_tools`): prompts then carry the system turn the template itself
writes for those tools, the same one the rollout derives its tool turns from. Without the
variable nothing changes.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any, Optional

from ...core.tool_turns import REGION_TOOLS, TOOLS, template_with_tools
from .common import PROMPT_TOOLS_ENV, mark_patched, patch_once


def prompt_tools_template() -> Optional[dict]:
    """The job's prompt-tools setting ({"chat_template": path or None}), or None when unset."""
    raw = os.environ.get(PROMPT_TOOLS_ENV)
    if not raw:
        return None
    try:
        setting = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{PROMPT_TOOLS_ENV} is not JSON ({e}): {raw[:200]!r}") from None
    if not isinstance(setting, dict):
        raise ValueError(f"{PROMPT_TOOLS_ENV} must be a JSON object, got {raw[:200]!r}")
    return setting


def give_prompts_tools(tokenizer: Any, processor: Any, chat_template_path: Optional[str] = None,
                       region_action: bool = False) -> None:
    """Make `tokenizer` and `processor` (each when it has a template) render prompts with the
    agent's tools (`crop` too with `region_action`), from the file `chat_template_path` when
    given, else from their own template."""
    tools = REGION_TOOLS if region_action else TOOLS
    named = Path(chat_template_path).read_text(encoding="utf-8") if chat_template_path else None
    patched = 0
    for owner in (processor, tokenizer):
        template = named or getattr(owner, "chat_template", None)
        if owner is None or not isinstance(template, str):
            continue
        owner.chat_template = template_with_tools(template, tools)
        patched += 1
    if not patched:
        raise ValueError("a tool_call run needs a chat template (one string) to render prompts with the "
                         "tool schemas; the tokenizer and processor have none: set worker.rollout.chat_template")


def patch_dataset(module: Any) -> dict:
    """Patch `verl.utils.dataset.RLHFDataset.__init__` (idempotent)."""
    def with_tools(original):
        signature = inspect.signature(original)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            setting = prompt_tools_template()
            if setting is not None:
                bound = signature.bind(self, *args, **kwargs).arguments
                give_prompts_tools(bound.get("tokenizer"), bound.get("processor"), setting.get("chat_template"),
                                   bool(setting.get("region_action", False)))
            original(self, *args, **kwargs)

        return mark_patched(__init__, original)

    return {"prompt_tools": patch_once(module.RLHFDataset, "__init__", with_tools)}
