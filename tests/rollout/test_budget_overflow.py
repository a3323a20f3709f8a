"""Why a "budget" ending: the rollout records what the result that did not fit needed.

Oracle: the recorded `tokens` is the smallest budget at which the same result builds an
observation at all: with one token less it does not (checked for every kind of result, in both
action formats). The real-engine side is in test_agent_faults (the tight-budget rollout).
"""

from __future__ import annotations

import io

import pytest
from PIL import Image

from vrag_rollout.core.actions import Fetch, Invalid, Search
from vrag_rollout.core.episode import Episode
from vrag_rollout.core.observation import ObservationBuilder, VisionTokens
from vrag_rollout.core.step import after_generation
from vrag_rollout.core.tool_turns import TOOLS, ToolTurnTemplate
from vrag_rollout.core.vision import page_band
from vrag_rollout.turn_output import TurnOutput
from vrag_rollout.retrieval.types import RetrievedPage, RetrieverFailure
from vrag_rollout.rollout.tools import Observer, Room


def jpeg(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (240, 240, 230)).save(out, format="JPEG")
    return out.getvalue()


@pytest.fixture(scope="module")
def observer(tiny_processor):
    tokenizer = tiny_processor.tokenizer
    builder = ObservationBuilder(tokenizer, VisionTokens.from_tokenizer(tokenizer), max_text_tokens=64)
    return Observer(builder, page_band(tiny_processor, 16 * 28 * 28, 64 * 28 * 28))


@pytest.fixture(scope="module")
def template(tiny_processor):
    return ToolTurnTemplate(tiny_processor.tokenizer, TOOLS)


BIG, SMALL = RetrievedPage("doc_1", "doc", 1, "image", jpeg(900, 1200)), RetrievedPage("doc_2", "doc", 2, "image", jpeg(200, 260))
TAG_CASES = {
    "search, two pages": (Search("q"), [BIG, SMALL], ("doc_1", "doc_2")),
    "no pages": (Search("q"), [], ()),
    "page text": (Fetch("text", 3), RetrievedPage("doc_3", "doc", 3, "text", "some page text " * 40), ("doc_3",)),
    "retriever failure": (Fetch("image", 4), RetrieverFailure("timeout", "the retriever timed out"), ()),
    "undecodable page": (Fetch("image", 5), RetrievedPage("doc_5", "doc", 5, "image", b"not a jpeg"), ()),
}


@pytest.mark.parametrize("case", TAG_CASES)
def test_tags_overflow_is_the_smallest_budget_that_fits(observer, case):
    action, outcome, pages = TAG_CASES[case]
    result = observer.observe_turn([(action, outcome, Room(3, 4))])[0]
    assert result.observation is None and result.overflow is not None
    needed = result.overflow.tokens
    assert result.overflow.page_ids == pages
    assert observer.observe_turn([(action, outcome, Room(needed, 4))])[0].observation is not None
    assert observer.observe_turn([(action, outcome, Room(needed - 1, 4))])[0].observation is None


def test_tags_overflow_of_a_full_image_allowance_is_the_limit_note(observer):
    result = observer.observe_turn([(Search("q"), [SMALL], Room(3, 0))])[0]
    needed = result.overflow.tokens
    fits = observer.observe_turn([(Search("q"), [SMALL], Room(needed, 0))])[0].observation
    assert fits is not None and "image limit" in observer.builder.decode(fits.trainer_ids)
    assert observer.observe_turn([(Search("q"), [SMALL], Room(needed - 1, 0))])[0].observation is None


def test_tool_turn_overflow_is_the_smallest_budget_that_fits(observer, template):
    calls = [Fetch("image", 1), Fetch("text", 3), Invalid("bad call", "invalid_json")]
    outcomes = [BIG, RetrievedPage("doc_3", "doc", 3, "text", "text " * 30), None]
    result = observer.observe_tool_turn(calls, outcomes, Room(5, 4), template)
    assert result.observation is None
    needed = result.overflow.tokens
    assert result.overflow.page_ids == ("doc_1", "doc_3")
    fits = observer.observe_tool_turn(calls, outcomes, Room(needed, 4), template).observation
    assert fits is not None and fits.num_images == 0  # the texts fit, the page image was left out
    assert observer.observe_tool_turn(calls, outcomes, Room(needed - 1, 4), template).observation is None


def test_an_error_that_does_not_fit_records_its_size(observer):
    builder = observer.builder
    episode = Episode(index=0, prompt_engine_ids=[1], prompt_images=[], doc_id="d", response_length=12, max_images=4)
    after_generation(episode, TurnOutput(token_ids=(7, 8, 9), text="<search></search>", finish_reason="stop",
                                         stop_reason="</search>"),
                     last_turn=False, fetch_modes=("image",), observations=builder)
    assert episode.termination == "budget"
    overflow = episode.budget_overflow
    assert overflow["turn"] == 1 and overflow["remaining"] == 9 and overflow["page_ids"] == []
    message = "the search query is empty; write <search>your query</search>."
    assert builder.error(message, overflow["tokens"]) is not None
    assert builder.error(message, overflow["tokens"] - 1) is None


def test_an_episode_that_did_not_end_on_its_budget_records_nothing(observer):
    episode = Episode(index=0, prompt_engine_ids=[1], prompt_images=[], doc_id="d", response_length=200, max_images=4)
    after_generation(episode, TurnOutput(token_ids=(7, 8), text="<answer>x</answer>", finish_reason="stop",
                                         stop_reason=None), last_turn=False, fetch_modes=("image",),
                     observations=observer.builder)
    assert episode.termination == "answered" and episode.budget_overflow is None
