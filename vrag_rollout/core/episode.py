"""One sample's growing response (pure).

Invariants every method keeps, checked by property tests:
- `len(response_ids) == len(loss_mask) == len(logprobs) == len(turn_ids) <= response_length`;
- `turn_ids` numbers each token's turn from 1: a turn's sampled tokens and the observation that
  answers them share it (`observation_turns[k]` is the turn of observation k);
- an image's pad run enters the response whole or not at all;
- `engine_response_ids` is `response_ids` with each image's pad run collapsed to one pad.

Under a context policy (`context_edit.py`) the response is the episode's current row: its first
`context_length` tokens are the edited context (out of the loss), and `segments` holds the rows
closed before it. Counters, `page_ids` and `turn_page_ids` stay the whole episode's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from .observation import Observation, Overflow
from .scope import current_document

# Why an episode ended. "budget": an observation did not fit the remaining response budget.
TERMINATION_REASONS = (
    "answered",  # EOS after an <answer>
    "eos",  # EOS without an answer
    "length",  # the response budget ran out while sampling
    "budget",  # the next observation did not fit the remaining budget
    "max_turns",  # the policy asked for a tool on its last allowed turn
    "abort",  # the engine aborted the request
)


@dataclass
class Episode:
    index: int  # position in the output batch
    prompt_engine_ids: list[int]  # raw prompt ids: one pad per prompt image
    prompt_images: list[Any]
    doc_id: Optional[str]
    response_length: int
    max_images: int
    response_ids: list[int] = field(default_factory=list)  # trainer view: pad runs expanded
    loss_mask: list[int] = field(default_factory=list)  # 1 = sampled by the policy
    logprobs: list[float] = field(default_factory=list)  # 0.0 at observation positions
    engine_response_ids: list[int] = field(default_factory=list)  # engine view: one pad per image
    turn_ids: list[int] = field(default_factory=list)  # per response token, its turn (1-based)
    observation_turns: list[int] = field(default_factory=list)  # per observation, the turn that asked
    # page id -> the page image as shown (whole pages, not crops): what a region action may name
    shown_pages: dict = field(default_factory=dict)
    last_page_id: Optional[str] = None  # the last whole page shown (VRAG-RL's `<bbox>` crops it)
    images: list[Any] = field(default_factory=list)  # retrieved vision.PageImage, sequence order
    # per retrieved image: None (a whole page) or the [x1, y1, x2, y2] page fractions a crop shows
    image_regions: list[Optional[list[float]]] = field(default_factory=list)
    page_ids: list[list[str]] = field(default_factory=list)  # one list per observation
    # Per image of the current row, parallel to `images`: its page id, the turn that showed it,
    # and its form ("full", or "thumbnail" after a context edit).
    image_page_ids: list[str] = field(default_factory=list)
    image_turns: list[int] = field(default_factory=list)
    image_forms: list[str] = field(default_factory=list)
    context_length: int = 0  # response tokens before the current row's own turns (context edits)
    segments: list = field(default_factory=list)  # context_edit.Segment rows closed before this one
    turns: int = 0
    searches: int = 0
    fetches: int = 0
    crops: int = 0
    invalid_kinds: Counter = field(default_factory=Counter)  # kind -> count (actions.Invalid.kind)
    calls_cut: int = 0  # tool calls left open when the episode's sampling hit the length limit
    retriever_errors: int = 0
    bad_requests: int = 0  # fetches the retriever refused as the policy's mistake (no such page)
    undecodable_pages: int = 0  # retrieved page images that could not be decoded (left out)
    images_dropped: int = 0
    visual_tokens: int = 0  # image tokens of every page the episode was shown (its visual budget spends these)
    images_shown: int = 0  # every image the episode was shown (an edit may take some out of `images`)
    answer: Optional[str] = None
    termination: Optional[str] = None
    # Why a "budget" ending: {"turn", "tokens", "remaining", "page_ids"} of the result that did
    # not fit (the tokens its smallest form needed, the tokens left); None otherwise.
    budget_overflow: Optional[dict] = None
    # When it ended (`time.perf_counter()`, set by the rollout's driver: core reads no clock).
    ended_at: Optional[float] = None

    @property
    def done(self) -> bool:
        return self.termination is not None

    @property
    def remaining(self) -> int:
        return self.response_length - len(self.response_ids)

    @property
    def current_document(self) -> Optional[str]:
        """The document a fetch reads: the row's, or in corpus scope the last page shown's (`scope`)."""
        return current_document(self.doc_id, self.page_ids)

    @property
    def image_slots(self) -> int:
        return self.max_images - len(self.prompt_images) - len(self.images)

    def engine_prompt(self) -> dict:
        """What the engine sees next: prompt and response so far, one pad per image."""
        request = {"prompt_token_ids": self.prompt_engine_ids + self.engine_response_ids}
        images = list(self.prompt_images) + [page.image for page in self.images]
        if images:
            request["multi_modal_data"] = {"image": images}
        return request

    def append_sampled(self, token_ids: Sequence[int], logprobs: Optional[Sequence[float]] = None) -> None:
        """Append the policy's tokens verbatim; they are cut to the budget should the engine overrun."""
        if self.done:
            raise RuntimeError(f"episode {self.index} already ended ({self.termination})")
        ids = list(token_ids)[: self.remaining]
        lps = [0.0] * len(ids) if logprobs is None else [float(x) for x in list(logprobs)[: len(ids)]]
        if len(lps) != len(ids):
            raise ValueError("one logprob per sampled token is required")
        self.response_ids.extend(ids)
        self.engine_response_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(lps)
        self.turn_ids.extend([self.turns + 1] * len(ids))
        self.turns += 1

    def append_observation(self, observation: Observation) -> bool:
        """Append an observation whole; False (nothing appended) when it does not fit."""
        if self.done:
            raise RuntimeError(f"episode {self.index} already ended ({self.termination})")
        if len(observation.trainer_ids) > self.remaining or observation.num_images > self.image_slots:
            return False
        self.response_ids.extend(observation.trainer_ids)
        self.engine_response_ids.extend(observation.engine_ids)
        self.loss_mask.extend([0] * len(observation.trainer_ids))
        self.logprobs.extend([0.0] * len(observation.trainer_ids))
        self.turn_ids.extend([self.turns] * len(observation.trainer_ids))
        self.observation_turns.append(self.turns)
        self.images.extend(observation.images)
        self.visual_tokens += sum(image.num_tokens for image in observation.images)
        self.images_shown += len(observation.images)
        for k, image in enumerate(observation.images):
            page_id, region = observation.image_page(k), observation.region_of(k)
            self.image_regions.append(None if region is None else list(region))
            self.image_page_ids.append(page_id)
            self.image_turns.append(self.turns)
            self.image_forms.append("full")
            if region is None:  # a whole page: what a later region action may name
                self.shown_pages[page_id] = image
                self.last_page_id = page_id
        self.images_dropped += observation.dropped_images
        self.page_ids.append(list(observation.page_ids))
        return True

    def turn_page_ids(self) -> list[list[str]]:
        """Per turn (1..turns), the page ids the observations answering it showed."""
        pages: list[list[str]] = [[] for _ in range(self.turns)]
        for turn, shown in zip(self.observation_turns, self.page_ids):
            pages[turn - 1].extend(shown)
        return pages

    @property
    def invalid_actions(self) -> int:
        return sum(self.invalid_kinds.values())

    def count_invalid(self, kind: str) -> None:
        self.invalid_kinds[kind] += 1

    def record_overflow(self, overflow: Optional[Overflow]) -> None:
        if self.done or overflow is None:
            return
        self.budget_overflow = {"turn": self.turns, "tokens": overflow.tokens, "remaining": self.remaining,
                                "page_ids": list(overflow.page_ids)}

    def finish(self, reason: str) -> None:
        if reason not in TERMINATION_REASONS:
            raise ValueError(f"unknown termination reason {reason!r}")
        if self.termination is None:
            self.termination = reason
