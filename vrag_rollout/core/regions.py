"""A region of a page, as a model family writes it, mapped to fractions of the page (pure).

The region action ("look closer": crop a page and zoom) names a box in the frame the model's
family grounds in (each family's documented convention):

- `RELATIVE_1000` (Qwen2-VL, Qwen3-VL): x and y in 0..1000 of the image's width and height,
  whatever its pixel size;
- `ABSOLUTE` (Qwen2.5-VL): pixels of the image as the model saw it, i.e. after the processor's
  resize: for a page the episode showed, its size in the page band (`vision.PageImage`).

Contract:
- `to_fractions(box, frame, shown_size)` -> `Region` (x1, y1, x2, y2 in 0..1 of the page), or
  `RegionError` saying what is wrong: not four finite numbers (anything else, of any type, ints
  past the float range included), inverted or empty, outside the frame (beyond a rounding
  tolerance of one unit, which is clamped), or narrower than `MIN_FRACTION` of the page on a
  side. `shown_size` (width, height) is required in `ABSOLUTE`.
- `from_fractions(region, frame, shown_size)` is its inverse (for grammars, demos and tests).
- `parse_region(body)`: the tag body `page, [x1, y1, x2, y2]` (VRAG-RL's `<bbox>` form without
  a page, `[x1, y1, x2, y2]`, gives page None: the last page shown) -> (page, box of four finite
  floats), or `RegionError` (a page outside 1..`readers.MAX_PAGE`, a number that is not finite).
- `resolve(page, box, frame, doc_id, shown_pages, last_page_id)`: a region action against its
  episode -> `RegionRequest` (page, region, page id), read against the page as it was shown;
  `RegionError` for a page not shown as an image (or none at all, for `<bbox>`).
Invariant: `to_fractions(from_fractions(r, f, s), f, s) == r` up to the frame's unit.
Every function here reads the policy's numbers through `readers`: whatever the box or page, the
answer is a region or a `RegionError` (a message for the policy), never another exception.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

from .readers import MAX_PAGE, clip, number_from_text, page_from_text, read_box, read_page

RELATIVE_1000 = "relative-1000"
ABSOLUTE = "absolute"
FRAMES = (RELATIVE_1000, ABSOLUTE)
MIN_FRACTION = 0.02  # a side narrower than 2% of the page: refused (the retriever's `batch_crop` rule too)

_NUMBER = r"\s*(-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf|-inf)\s*"
_BOX = re.compile(r"^\s*\[" + ",".join([_NUMBER] * 4) + r"\]\s*$", re.IGNORECASE)
_PAGE_AND_BOX = re.compile(r"^\s*(-?\d+)\s*,\s*(\[.*\])\s*$", re.DOTALL)


class RegionError(ValueError):
    """A box that names no usable region; the message is written for the policy to correct."""


@dataclass(frozen=True)
class Region:
    x1: float
    y1: float
    x2: float
    y2: float


def _extent(frame: str, shown_size: Optional[Sequence[int]]) -> tuple[float, float]:
    if frame == RELATIVE_1000:
        return 1000.0, 1000.0
    if frame == ABSOLUTE:
        if not shown_size or min(shown_size) <= 0:
            raise RegionError("an absolute box needs the size of the image as shown")
        return float(shown_size[0]), float(shown_size[1])
    raise ValueError(f"unknown grounding frame {frame!r}; known: {FRAMES}")


def to_fractions(box: Sequence[float], frame: str, shown_size: Optional[Sequence[int]] = None) -> Region:
    width, height = _extent(frame, shown_size)
    x1, y1, x2, y2 = _finite_box(box)
    if x2 <= x1 or y2 <= y1:
        raise RegionError("the box is empty or inverted: write [left, top, right, bottom] with right > left "
                          "and bottom > top")
    limit = f"0..{width:g} x 0..{height:g}" if frame == ABSOLUTE else "0..1000"
    if x1 < -1 or y1 < -1 or x2 > width + 1 or y2 > height + 1:
        raise RegionError(f"the box lies outside the page (coordinates are {limit})")
    region = Region(max(x1, 0.0) / width, max(y1, 0.0) / height, min(x2, width) / width, min(y2, height) / height)
    if region.x2 - region.x1 < MIN_FRACTION or region.y2 - region.y1 < MIN_FRACTION:
        raise RegionError(f"the box is too small to zoom into (at least {MIN_FRACTION:.0%} of the page on each side)")
    return region


def _finite_box(box: object) -> tuple[float, float, float, float]:
    """Four finite floats, or the `RegionError` that says why `box` is not."""
    numbers = read_box(box)
    if numbers is not None:
        return numbers
    if not isinstance(box, (list, tuple)):
        raise RegionError("a box is 4 numbers [x1, y1, x2, y2]")
    if len(box) != 4:
        raise RegionError(f"a box is 4 numbers [x1, y1, x2, y2], got {len(box)}")
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in box):
        raise RegionError("the box holds a number that is not finite")
    raise RegionError("a box is 4 numbers [x1, y1, x2, y2]")


def from_fractions(region: Region, frame: str, shown_size: Optional[Sequence[int]] = None) -> tuple[int, int, int, int]:
    width, height = _extent(frame, shown_size)
    return (round(region.x1 * width), round(region.y1 * height), round(region.x2 * width), round(region.y2 * height))


def parse_region(body: str) -> tuple[Optional[int], tuple[float, ...]]:
    page = None
    found = _PAGE_AND_BOX.match(body)
    if found:
        page, body = page_from_text(found.group(1)), found.group(2)
        if page is None:
            raise RegionError(f"page {clip(found.group(1), 12)} does not exist: pages count from 1 "
                              f"(to at most {MAX_PAGE})")
    box = _BOX.match(body)
    if box is None:
        raise RegionError("write the region as <crop>page, [x1, y1, x2, y2]</crop>")
    numbers = [number_from_text(v) for v in box.groups()]
    if any(v is None for v in numbers):
        raise RegionError("the box holds a number that is not finite (or has too many digits)")
    return page, tuple(numbers)


@dataclass(frozen=True)
class RegionRequest:
    """A region action resolved against its episode: what the retriever is asked to render."""

    page: int
    region: Region
    page_id: str  # `<doc>_<page>` of the page as shown


def resolve(page: Optional[int], box: Sequence[float], frame: str, doc_id: Optional[str], shown_pages: dict,
            last_page_id: Optional[str]) -> RegionRequest:
    """The region of a page the episode was shown (`shown_pages`: page id -> `vision.PageImage`;
    page None: `last_page_id`), the box read in `frame` against the page as shown; `RegionError`
    (written for the policy) when the page was not shown or the box is unusable."""
    if page is None:
        if last_page_id is None:
            raise RegionError("no page has been shown yet: fetch or search pages before looking closer")
        page_id = last_page_id
        page = int(page_id.rpartition("_")[2])
    elif read_page(page) is None:
        raise RegionError(f"page {clip(page, 12)} does not exist: pages count from 1 (to at most {MAX_PAGE})")
    else:
        page_id = f"{doc_id}_{page}"
    shown = shown_pages.get(page_id)
    if shown is None:
        raise RegionError(f"page {page} has not been shown as an image yet: fetch it before looking closer")
    return RegionRequest(page, to_fractions(box, frame, shown.image.size), page_id)
