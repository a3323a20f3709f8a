"""Reading the action a turn's sampled text ends with (pure).

A turn ends in one of four ways, reported by the engine: a tool stop string (`</search>` or
`</fetch>`), EOS, the token budget, or an abort. Only the text is parsed here; the token ids the
policy sampled are kept verbatim elsewhere.

What a policy really writes, and what it means (the tests run these on real engine output):
- an answer completed before a tool call in the same turn (`<answer>a</answer><search>q</search>`):
  the answer ends the episode; the call is not executed;
- text after `</answer>` up to EOS: the last complete answer counts, the rest is ignored;
- an unterminated `<answer>` or tool tag at EOS: no action, the episode ends with "eos"; at the
  length limit it ends with "length" (nothing half-written is executed);
- the engine reporting a tool stop string the text does not contain: the body runs to the end
  of the text (the engine did stop there), never one character short;
- an empty query, a fetch that cannot be read or a page below 1: an error observation for the
  policy to correct (counted as an invalid action); a page past the document's end is the
  retriever's to refuse (counted apart from retriever failures), one past `readers.MAX_PAGE`
  (no document is that long) is an invalid action;
- whatever the text holds (numbers of any size or none, any unicode), `parse_action` returns one
  of the actions below and never raises: numbers are read through `readers`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from .readers import MAX_PAGE, clip, page_from_text
from ..turn_output import LENGTH, STOP

SEARCH_STOP = "</search>"
FETCH_STOP = "</fetch>"
TOOL_STOPS = (SEARCH_STOP, FETCH_STOP)
CROP_STOP = "</crop>"
BBOX_STOP = "</bbox>"  # VRAG-RL's spelling of the region action: the last page shown
REGION_STOPS = (CROP_STOP, BBOX_STOP)

# Longest query we pass on; longer ones are treated as malformed so the model learns brevity.
MAX_QUERY_CHARS = 512

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# "image, 3" / "text,3" / "image 3", and the seed implementation's "3-th" (an image fetch).
# ASCII digits only (`re.ASCII`): the prompts teach them, and `\d` alone would read "٣" as a 3 that
# no other reader (the reward's format check reads fetches through `parse_fetch` too) agrees on.
_FETCH_SPEC = re.compile(r"^\s*(?:(?P<modality>[a-zA-Z]+)\s*[, ]\s*(?P<page>-?\d+)|(?P<nth>\d+)-th)\s*$", re.ASCII)


@dataclass(frozen=True)
class Search:
    query: str


@dataclass(frozen=True)
class Fetch:
    modality: str  # "image" | "text"
    page: int  # 1-based, as the model sees pages


@dataclass(frozen=True)
class Crop:
    """Look closer: a region of a page, the box in the model family's grounding frame."""

    page: Optional[int]  # 1-based; None: the last page the episode was shown (`<bbox>`)
    box: tuple[float, ...]


@dataclass(frozen=True)
class Answer:
    text: str


@dataclass(frozen=True)
class Stop:
    """The turn ended the episode without an action: EOS without an answer, length or abort."""

    reason: str  # "eos" | "length" | "abort"


@dataclass(frozen=True)
class Invalid:
    """A tool call the rollout cannot execute; the message goes back to the model, and `kind`
    names the mistake in the metrics (`rollout/invalid_actions/<kind>`)."""

    message: str
    kind: str = "malformed"


Action = Union[Search, Fetch, Crop, Answer, Stop, Invalid]


@dataclass
class ToolCall:
    """One request of a turn for the retriever: the action and whose document it reads."""

    sample: int  # index into the turn's episode list
    action: Union[Search, Fetch]  # (or a resolved region request)
    doc_id: Optional[str]


def parse_action(
    text: str,
    finish_reason: str,
    stop_reason: object,
    fetch_modes: Sequence[str] = ("image", "text"),
    regions: bool = False,
) -> Action:
    """The action that ends a turn.

    `finish_reason`/`stop_reason` are vLLM's: "stop" with a stop string means a tool call, "stop"
    with None or an int token id means EOS, "length" means the budget ran out.
    """
    if finish_reason == STOP and isinstance(stop_reason, str) and stop_reason in TOOL_STOPS:
        return _parse_tool_call(text, stop_reason, fetch_modes)
    if regions and finish_reason == STOP and isinstance(stop_reason, str) and stop_reason in REGION_STOPS:
        return _parse_region_call(text, stop_reason)
    if finish_reason == STOP:
        answers = _ANSWER.findall(text)
        return Answer(answers[-1].strip()) if answers else Stop("eos")
    if finish_reason == LENGTH:
        return Stop("length")
    return Stop("abort")


def _parse_tool_call(text: str, stop: str, fetch_modes: Sequence[str]) -> Action:
    tag = "search" if stop == SEARCH_STOP else "fetch"
    # A stop string may complete inside a token that carries characters after it: cut there.
    end = text.rfind(stop)
    if end < 0:  # reported but not in the text: the engine stopped at the text's end
        end = len(text)
    start = text.rfind(f"<{tag}>", 0, end)
    answers = list(_ANSWER.finditer(text, 0, start if start >= 0 else end))
    if answers:  # the policy answered before calling the tool: the answer ends the episode
        return Answer(answers[-1].group(1).strip())
    if start < 0:
        return Invalid(f"<{tag}> is missing before </{tag}>; write <{tag}>...</{tag}>.", "missing_open_tag")
    body = text[start + len(tag) + 2 : end].strip()
    if tag == "search":
        if not body:
            return Invalid("the search query is empty; write <search>your query</search>.", "empty_query")
        if len(body) > MAX_QUERY_CHARS:
            return Invalid(f"the search query is longer than {MAX_QUERY_CHARS} characters.", "long_query")
        return Search(body)
    return parse_fetch(body, fetch_modes)


def _parse_region_call(text: str, stop: str) -> Action:
    from .regions import RegionError, parse_region

    tag = stop[2:-1]
    end = text.rfind(stop)
    end = len(text) if end < 0 else end
    start = text.rfind(f"<{tag}>", 0, end)
    answers = list(_ANSWER.finditer(text, 0, start if start >= 0 else end))
    if answers:
        return Answer(answers[-1].group(1).strip())
    if start < 0:
        return Invalid(f"<{tag}> is missing before </{tag}>; write <{tag}>...</{tag}>.", "missing_open_tag")
    try:
        page, box = parse_region(text[start + len(tag) + 2: end])
    except RegionError as error:
        return Invalid(f"{error}.", "bad_region")
    if tag == "crop" and page is None:
        return Invalid("write the region as <crop>page, [x1, y1, x2, y2]</crop>.", "bad_region")
    return Crop(page, box)


def parse_fetch(body: str, fetch_modes: Sequence[str] = ("image", "text")) -> Action:
    """A `<fetch>` body as the rollout executes it: `Fetch`, or `Invalid` saying why not."""
    modes = " or ".join(fetch_modes)
    usage = f"write <fetch>{fetch_modes[0]}, 3</fetch> with modality {modes} and a page number from 1."
    match = _FETCH_SPEC.match(body)
    if not match:
        return Invalid(f"cannot read fetch '{clip(body, 60)}'; {usage}", "unreadable_fetch")
    if match.group("nth"):
        modality, digits = "image", match.group("nth")
    else:
        modality, digits = match.group("modality").lower(), match.group("page")
    if modality not in fetch_modes:
        return Invalid(f"fetch modality '{clip(modality, 20)}' is not available; {usage}", "bad_modality")
    page = page_from_text(digits)  # None below 1 (a sign), past MAX_PAGE, or of thousands of digits
    if page is None:
        return Invalid(f"page numbers start at 1 (at most {MAX_PAGE}), got {clip(digits, 12)}; {usage}", "bad_page")
    return Fetch(modality, page)
