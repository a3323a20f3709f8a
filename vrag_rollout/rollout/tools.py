"""Executing one turn's tool calls and turning their results into observations.

All searches of a turn go to the retriever in one batched call and all fetches in another (the
two run side by side). Every outcome is a page list, a page, or a `RetrieverFailure`: a failure
becomes an error observation for that sample only.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

from ..core.actions import Crop, Fetch, Invalid, Search, ToolCall
from ..core.regions import RegionError, RegionRequest
from ..core.observation import IMAGE_LIMIT, NO_PAGES, VISUAL_LIMIT, Observation, ObservationBuilder, Overflow
from ..core.pages import PageCache, content_key
from ..core.scope import NO_CURRENT_DOCUMENT
from ..retrieval.types import FetchSpec, RetrievedPage, RetrieverFailure

# The RetrieverFailure kind of a request the retriever refused as the asker's mistake.
REQUEST_FAILURE = "request"
from ..core.vision import ImageDecodeError, PixelBand, decode_page, decode_page_file, lowered_band, page_of

UNLIMITED = 1 << 30  # a budget or image count that never binds: measuring an observation's size

Outcome = Union[list, RetrievedPage, RetrieverFailure]


@dataclass
class ObservationResult:
    observation: Optional[Observation]  # None: it did not fit the budget
    overflow: Optional[Overflow] = None  # when it did not fit: what the smallest form needed
    retriever_error: int = 0  # calls the retriever failed (0 or 1 for the tag format)
    decode_errors: int = 0
    # Calls the retriever refused as the policy's mistake (a page the document does not have, an
    # unreadable fetch), counted apart from retriever faults.
    bad_request: int = 0
    searches: int = 0  # executed calls (the tag format counts its one action itself)
    fetches: int = 0
    crops: int = 0


def call_retriever(calls: Sequence[ToolCall], client: Any, top_n: int, band: Optional[PixelBand] = None) -> list[Outcome]:
    """Outcomes in the order of `calls`, from at most one search, one fetch and one crop request
    batch (run side by side). A region action that could not be resolved (`RegionError`) is
    answered here, as the policy's mistake; crops are rendered into `band`."""
    outcomes: list[Outcome] = [None] * len(calls)  # type: ignore[list-item]
    # A search without a document ranks the whole corpus; a fetch or crop needs one (`core.scope`).
    kinds = {kind: [i for i, c in enumerate(calls) if isinstance(c.action, kind)
                    and (c.doc_id is not None or kind is Search)]
             for kind in (Search, Fetch, RegionRequest)}
    for i, call in enumerate(calls):
        if isinstance(call.action, RegionError):
            outcomes[i] = RetrieverFailure(REQUEST_FAILURE, str(call.action))
        elif call.doc_id is None and not isinstance(call.action, Search):
            outcomes[i] = RetrieverFailure(REQUEST_FAILURE, NO_CURRENT_DOCUMENT)

    def run(kind: type) -> list:
        chosen = kinds[kind]
        if not chosen:
            return []
        docs = [calls[i].doc_id for i in chosen]
        if kind is Search:
            return client.batch_search([calls[i].action.query for i in chosen], docs, top_n)
        if kind is Fetch:
            return client.batch_fetch([FetchSpec(calls[i].action.modality, calls[i].action.page) for i in chosen], docs)
        regions = [calls[i].action.region for i in chosen]
        return client.batch_crop(docs, [calls[i].action.page for i in chosen],
                                 [(r.x1, r.y1, r.x2, r.y2) for r in regions], band.min_pixels, band.max_pixels,
                                 factor=band.factor)

    busy = [kind for kind, chosen in kinds.items() if chosen]
    if len(busy) > 1:
        with ThreadPoolExecutor(max_workers=len(busy)) as pool:
            futures = {kind: pool.submit(run, kind) for kind in busy}
            results = {kind: future.result() for kind, future in futures.items()}
    else:
        results = {kind: run(kind) for kind in busy}
    for kind, found in results.items():
        for i, result in zip(kinds[kind], found):
            outcomes[i] = result
    return outcomes


@dataclass(frozen=True)
class Room:
    """What one call's observation may fill, read from its episode when the call went out."""

    budget: int  # response tokens
    image_slots: int
    visual_tokens: Optional[int] = None  # the episode's visual-token budget left (None: no limit)


@dataclass
class Observer:
    """Builds observations for tool outcomes: decodes and resizes pages into their band, each
    distinct page once per band (`pages`: every episode shown a page holds its one entry and image).

    Bands: `band` for fetched pages and crops; `search_band` (thumbnails) for search results when
    set; under a visual-token budget an observation's pages share what is left, each page's band
    lowered to its share, never below `floor_pixels` (the trainer's smallest image): a page
    whose share is smaller is left out and the policy told so (`VISUAL_LIMIT`)."""

    builder: ObservationBuilder
    band: PixelBand
    decoder: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(max_workers=4))
    pages: PageCache = field(default_factory=PageCache)
    search_band: Optional[PixelBand] = None
    floor_pixels: int = 0

    def band_for(self, action: Any, room: Room, pages: int) -> Optional[PixelBand]:
        """The band of `pages` image pages answering `action` within `room`; None: no room left."""
        band = self.search_band if self.search_band is not None and isinstance(action, Search) else self.band
        if room.visual_tokens is None or pages == 0:
            return band
        return lowered_band(band, room.visual_tokens // pages * band.factor ** 2, self.floor_pixels)

    def observe_turn(self, items: Sequence[tuple]) -> list[ObservationResult]:
        """(action, outcome, room) per tool call -> one result each.

        Every image page of the turn is decoded in one parallel pass (the decoder releases the GIL).
        """
        bands = [self.band_for(action, room, len(_image_pages(outcome))) for action, outcome, room in items]
        pages = [(page, band or self.band) for (_, outcome, _), band in zip(items, bands)
                 for page in _image_pages(outcome)]
        decoded = self._decode_all(pages)
        return [self._observe(action, outcome, room.budget, room.image_slots if band else 0, decoded,
                              limit=IMAGE_LIMIT if band else VISUAL_LIMIT)
                for (action, outcome, room), band in zip(items, bands)]

    def _observe(self, action: Union[Search, Fetch, Crop], outcome: Outcome, budget: int, image_slots: int,
                 decoded: dict, limit: str = "") -> ObservationResult:
        """The call's observation within `budget`; when it does not fit, what its smallest form
        needed (`overflow`, each case's own, computed only then)."""
        builder = self.builder
        if isinstance(outcome, RetrieverFailure):
            mistake = outcome.kind == REQUEST_FAILURE
            return _fitted(builder.error(outcome.message, budget), lambda: builder.error_overflow(outcome.message),
                           retriever_error=not mistake, bad_request=mistake)
        pages = outcome if isinstance(outcome, list) else [outcome]
        text_pages = [p for p in pages if p.modality == "text"]
        if text_pages:
            page = text_pages[0]
            return _fitted(builder.text(page.contents, page.page_id, budget), lambda: builder.text_overflow(page.page_id))
        images = [decoded[id(page)] for page in pages if decoded[id(page)] is not None]
        page_ids = [page.page_id for page in pages if decoded[id(page)] is not None]
        decode_errors = len(pages) - len(images)
        if pages and not images:
            message = _undecodable(action)
            return _fitted(builder.error(message, budget), lambda: builder.error_overflow(message),
                           retriever_error=True, decode_errors=decode_errors)
        observation = builder.pages(images, page_ids, budget, image_slots, limit or IMAGE_LIMIT)
        region_of = {id(decoded[id(page)]): page.region for page in pages if decoded[id(page)] is not None}
        if observation is not None and any(region_of.values()):  # the builder may leave pages out
            observation = dataclasses.replace(
                observation, image_regions=tuple(region_of[id(image)] for image in observation.images))
        return _fitted(observation, lambda: builder.pages_overflow(images, page_ids, image_slots, limit or IMAGE_LIMIT),
                       decode_errors=decode_errors)

    def observe_tool_turn(self, calls: Sequence[Any], outcomes: Sequence[Any], room: Room,
                          template: Any) -> ObservationResult:
        """One tool turn (native tool-call format) answering every call of an assistant turn in
        order: pages as images with their ids, page text, or an error text. Page images that do
        not fit the budget or the image slots are left out from the last one back (their ids
        stay, marked as left out); None when not even the texts fit. Under a visual-token
        budget the turn's pages share what is left."""
        count = sum(len(_image_pages(outcome)) for outcome in outcomes)
        bands = [self.band_for(call, room, count) for call in calls]
        budget, image_slots = room.budget, room.image_slots if all(bands) else 0
        why = "no room" if all(bands) else "the visual budget of this episode is spent"
        pages = [(page, band or self.band) for outcome, band in zip(outcomes, bands) for page in _image_pages(outcome)]
        decoded = self._decode_all(pages)
        counts = ObservationResult(None)
        # per call: (images, text, the id of a text page shown, else None)
        answers = [self._tool_answer(call, outcome, decoded, counts) for call, outcome in zip(calls, outcomes)]
        kept = [len(images) for images, _, _ in answers]
        while True:
            observation = self._tool_observation(answers, kept, budget, image_slots, template, why)
            if observation is not None or not any(kept):
                counts.observation = observation
                if observation is None:  # not even the texts fit: what they needed, images all left out
                    texts_only = self._tool_observation(answers, kept, UNLIMITED, UNLIMITED, template)
                    counts.overflow = Overflow(len(texts_only.trainer_ids),
                                               _shown_in_order(answers, [len(imgs) for imgs, _, _ in answers]))
                return counts
            last = max(i for i, k in enumerate(kept) if k)
            kept[last] -= 1

    def _tool_answer(self, call: Any, outcome: Any, decoded: dict, counts: ObservationResult) -> tuple:
        """(images as (image, page id, region), the message's text, the id of the text page it
        shows or None)."""
        if isinstance(call, Invalid):
            return [], f"error: {call.message}", None
        # every call made counts, answered or not, as in the tags format; failures count apart
        counts.searches += int(isinstance(call, Search))
        counts.fetches += int(isinstance(call, Fetch))
        counts.crops += int(isinstance(call, Crop))
        if isinstance(outcome, RetrieverFailure):
            mistake = outcome.kind == REQUEST_FAILURE
            counts.bad_request += int(mistake)
            counts.retriever_error += int(not mistake)
            return [], f"error: {outcome.message}", None
        found = outcome if isinstance(outcome, list) else [outcome]
        if not found:
            return [], NO_PAGES, None
        if found[0].modality == "text":
            ids = self.builder.encode_text(found[0].contents)[: self.builder.max_text_tokens]
            return [], f"page {found[0].page_id}:\n" + self.builder.decode(ids), found[0].page_id
        images = [(decoded[id(p)], p.page_id, p.region) for p in found if decoded[id(p)] is not None]
        counts.decode_errors += len(found) - len(images)
        if not images:
            counts.retriever_error += 1
            return [], f"error: {_undecodable(call)}", None
        if isinstance(call, Crop):
            page = found[0].page_id.rpartition("_")[2]
            return images, f"region of page {page}: [{', '.join(f'{v:g}' for v in call.box)}]", None
        return images, "pages: " + ", ".join(page_id for _, page_id, _ in images), None

    def _tool_observation(self, answers: list, kept: list, budget: int, image_slots: int,
                          template: Any, why: str = "no room") -> Optional[Observation]:
        from ..core.tool_turns import ToolResult

        if sum(kept) > max(image_slots, 0):
            return None
        images = [img for (imgs, _, _), k in zip(answers, kept) for img in imgs[:k]]
        results = [ToolResult(text if k == len(imgs) else text + f" ({len(imgs) - k} left out: {why})", images=k)
                   for (imgs, text, _), k in zip(answers, kept)]
        engine_ids = template.observation_ids(results)
        pad = self.builder.vision.image_pad
        if engine_ids.count(pad) != len(images):
            raise RuntimeError(f"the chat template rendered {engine_ids.count(pad)} image pads for {len(images)} images")
        trainer_ids: list[int] = []
        pages = iter(images)
        for token in engine_ids:
            trainer_ids.extend([pad] * next(pages)[0].num_tokens if token == pad else [token])
        if len(trainer_ids) > budget:
            return None
        regions = tuple(region for _, _, region in images)
        return Observation(engine_ids=tuple(engine_ids), trainer_ids=tuple(trainer_ids),
                           images=tuple(img for img, _, _ in images),
                           page_ids=_shown_in_order(answers, kept),
                           image_page_ids=tuple(pid for _, pid, _ in images),
                           dropped_images=sum(len(imgs) for imgs, _, _ in answers) - len(images),
                           image_regions=regions if any(regions) else ())

    def _decode_all(self, pages: Sequence[tuple[RetrievedPage, PixelBand]]) -> dict:
        """id(page) -> its PageImage in its band (None: undecodable), each distinct page and band
        decoded once (in parallel: the decoder releases the GIL), however often it is served."""
        # the band is part of the key: the trainer's band may narrow it between rollout calls,
        # and thumbnails and budgets give one page several bands
        keys = [(content_key(page.contents), band) for page, band in pages]
        distinct = dict(zip(keys, pages))
        entries = dict(zip(distinct, self.decoder.map(self._entry, distinct, distinct.values())))
        return {id(page): None if entries[key] is None else page_of(entries[key], key[1])
                for (page, _), key in zip(pages, keys)}

    def _entry(self, key: tuple, item: tuple[RetrievedPage, PixelBand]) -> Any:
        return self.pages.get(key, lambda: self._decode_new(*item))

    @staticmethod
    def _decode_new(page: RetrievedPage, band: PixelBand) -> Any:
        try:
            # bytes: the JPEG itself (a binary answer); str: base64 (JSON, fixtures)
            if isinstance(page.contents, bytes):
                return decode_page_file(page.contents, band).entry
            return decode_page(page.contents, band).entry
        except ImageDecodeError:
            return None


def _fitted(observation: Optional[Observation], overflow: Callable[[], Overflow], **counts: Any) -> ObservationResult:
    return ObservationResult(observation, overflow() if observation is None else None, **counts)


def _shown_in_order(answers: Sequence[tuple], kept: Sequence[int]) -> tuple[str, ...]:
    """The page ids a tool turn shows, in the order it renders them: call by call, each call's
    kept images, or its text page (the reward ranks them in this order, and corpus scope reads
    the document of the last one)."""
    return tuple(pid for (imgs, _, text_page), k in zip(answers, kept)
                 for pid in [pid for _, pid, _ in imgs[:k]] + ([text_page] if text_page else []))


def _undecodable(action: Union[Search, Fetch, Crop]) -> str:
    what = {Fetch: "page image", Crop: "region image"}.get(type(action), "result page images")
    return f"the {what} could not be decoded."


def _image_pages(outcome: Optional[Outcome]) -> list[RetrievedPage]:
    if outcome is None or isinstance(outcome, RetrieverFailure):  # None: an invalid call, never sent
        return []
    pages = outcome if isinstance(outcome, list) else [outcome]
    return [page for page in pages if page.modality == "image"]
