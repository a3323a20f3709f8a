"""Turning tool results into observation tokens (pure, given a tokenizer and the page geometry).

An image observation has two views built from one grid computation: the engine view holds one
`<|image_pad|>` per image (vLLM expands it itself), the trainer view holds the expanded run of
t*h*w/merge^2 pads that the actor's processor will produce features for.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ..families import BANNED_SPECIAL_TOKENS, VISION_TOKENS
from .serial_tokenizer import serial

RESULT_OPEN = "<result>"
RESULT_CLOSE = "</result>"
NO_PAGES = "no pages found for this query."
IMAGE_LIMIT = "the image limit of this episode is reached; answer now."
VISUAL_LIMIT = "the visual budget of this episode is spent: no more page images; fetch text or answer."

@dataclass(frozen=True)
class VisionTokens:
    vision_start: int
    vision_end: int
    image_pad: int
    # Every vision special token id: the policy must never sample these (logit_bias bans them).
    banned: tuple[int, ...]

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> "VisionTokens":
        vocab = tokenizer.get_vocab()
        missing = [t for t in VISION_TOKENS[:2] + ("<|image_pad|>",) if t not in vocab]
        if missing:
            raise ValueError(f"tokenizer lacks the Qwen VL vision tokens {missing}")
        banned = tuple(vocab[t] for t in BANNED_SPECIAL_TOKENS if t in vocab)
        return cls(vocab["<|vision_start|>"], vocab["<|vision_end|>"], vocab["<|image_pad|>"], banned)


@dataclass(frozen=True)
class Observation:
    engine_ids: tuple[int, ...]
    trainer_ids: tuple[int, ...]
    images: tuple[Any, ...] = ()  # vision.PageImage, in sequence order
    page_ids: tuple[str, ...] = ()  # the pages shown (images and text), in the order rendered
    dropped_images: int = 0  # pages left out because they did not fit the budget or image limit
    is_error: bool = False
    # Per image: None for a page as shown, or the region of it a crop shows ((x1, y1, x2, y2)
    # as fractions of the page `image_page(k)`); empty: every image is a whole page.
    image_regions: tuple[Optional[tuple[float, ...]], ...] = ()
    # Per image, its page id, where `page_ids` also holds text pages (a tool turn); empty: image
    # k shows page `page_ids[k]`.
    image_page_ids: tuple[str, ...] = ()

    @property
    def num_images(self) -> int:
        return len(self.images)

    def image_page(self, k: int) -> str:
        """The page id of image `k`."""
        return (self.image_page_ids or self.page_ids)[k]

    def region_of(self, k: int) -> Optional[tuple[float, ...]]:
        """The region image `k` shows (None: the whole page)."""
        return self.image_regions[k] if k < len(self.image_regions) else None


@dataclass(frozen=True)
class Overflow:
    """A result that did not fit the response budget: the fewest tokens an observation of it
    needed, and the pages it would have shown."""

    tokens: int
    page_ids: tuple[str, ...] = ()


@dataclass
class ObservationBuilder:
    """Safe to call from several threads at once: the tokenizer is used through its lock
    (`serial_tokenizer`), and nothing else here changes after construction."""

    tokenizer: Any
    vision: VisionTokens
    max_text_tokens: int = 512
    _open: tuple[int, ...] = field(init=False, repr=False)
    _close: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.tokenizer = serial(self.tokenizer)
        self._open = tuple(self.encode_text(RESULT_OPEN))
        self._close = tuple(self.encode_text(RESULT_CLOSE))

    def encode_text(self, text: str) -> list[int]:
        """Plain text as ids; special-token strings inside page text stay plain text."""
        return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    @property
    def _overhead(self) -> int:
        return len(self._open) + len(self._close)

    def image_block(self, num_tokens: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(engine ids, trainer ids) of one image."""
        v = self.vision
        return (v.vision_start, v.image_pad, v.vision_end), (v.vision_start,) + (v.image_pad,) * num_tokens + (
            v.vision_end,
        )

    def pages(
        self,
        images: Sequence[Any],
        page_ids: Sequence[str],
        budget: int,
        image_slots: int,
        limit: str = IMAGE_LIMIT,
    ) -> Optional[Observation]:
        """An observation with as many whole pages, best first, as fit `budget` tokens and
        `image_slots` images; None when not even the empty result block fits. With no image
        slot at all the policy is told `limit` (why no more images can be shown)."""
        if budget < self._overhead:
            return None
        room = budget - self._overhead
        engine, trainer, kept, kept_ids = [], [], [], []
        for image, page_id in zip(images, page_ids):
            block_engine, block_trainer = self.image_block(image.num_tokens)
            if len(kept) >= image_slots or len(block_trainer) > room:
                continue  # a later, smaller page may still fit
            engine.extend(block_engine)
            trainer.extend(block_trainer)
            kept.append(image)
            kept_ids.append(page_id)
            room -= len(block_trainer)
        if not images:
            return self.message(NO_PAGES, budget)
        if not kept and image_slots <= 0:
            told = self.message(limit, budget)
            return None if told is None else dataclasses.replace(told, dropped_images=len(images))
        if not kept:
            return None  # pages existed but none fits: the episode ends on its budget
        return Observation(
            engine_ids=self._wrap(engine),
            trainer_ids=self._wrap(trainer),
            images=tuple(kept),
            page_ids=tuple(kept_ids),
            dropped_images=len(images) - len(kept),
        )

    def text(self, text: str, page_id: str, budget: int) -> Optional[Observation]:
        """Page text, cut to `max_text_tokens` and to the budget."""
        room = min(budget - self._overhead, self.max_text_tokens)
        if room < 1:
            return None
        ids = self.encode_text(text)[:room]
        wrapped = self._wrap(ids)
        return Observation(engine_ids=wrapped, trainer_ids=wrapped, page_ids=(page_id,))

    def message(self, message: str, budget: int, is_error: bool = False) -> Optional[Observation]:
        """A short text for the model (an error, a correction); None if it does not fit whole."""
        wrapped = self._wrap(self.encode_text(message))
        if len(wrapped) > budget:
            return None
        return Observation(engine_ids=wrapped, trainer_ids=wrapped, is_error=is_error)

    def error(self, message: str, budget: int) -> Optional[Observation]:
        return self.message(f"error: {message}", budget, is_error=True)

    # ---- what a result that did not fit would have needed (for the batch's budget_overflow) ----
    def pages_overflow(self, images: Sequence[Any], page_ids: Sequence[str], image_slots: int,
                       limit: str = IMAGE_LIMIT) -> Overflow:
        """The smallest page, whole, inside the result block (no page: the note saying so)."""
        if not images:
            return self.message_overflow(NO_PAGES)
        if image_slots <= 0:
            return self.message_overflow(limit)
        smallest = min((len(self.image_block(image.num_tokens)[1]) for image in images), default=0)
        return Overflow(self._overhead + smallest, tuple(page_ids))

    def text_overflow(self, page_id: str) -> Overflow:
        """One token of the page's text inside the result block."""
        return Overflow(self._overhead + 1, (page_id,))

    def message_overflow(self, message: str) -> Overflow:
        return Overflow(len(self._wrap(self.encode_text(message))))

    def error_overflow(self, message: str) -> Overflow:
        return self.message_overflow(f"error: {message}")

    def _wrap(self, inner: Sequence[int]) -> tuple[int, ...]:
        return self._open + tuple(inner) + self._close
