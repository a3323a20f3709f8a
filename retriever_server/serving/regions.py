"""Crop geometry, pure: where a box falls on a page, and the size its crop is drawn at.

A box is ``[x1, y1, x2, y2]``, fractions of the page image the model saw (the stored one; origin
top left), already checked by ``contract.box_problem``. Its *source* is what the crop is drawn
from: the page of the PDF (sizes in points, 1/72 inch; the box mapped through `stored_window`,
what the stored image shows of the page) or the stored page image (sizes in pixels).

The resolution rule (`crop_size`): a crop is as sharp as the caller's band allows. The region
is scaled so its area is ``max_pixels`` (keeping its aspect ratio), but never beyond
`MAX_PDF_SCALE` (600 dpi) for a PDF, nor beyond the stored pixels for an image (upscaling adds
no detail); the result is then fitted into ``[min_pixels, max_pixels]`` by the project's
``smart_resize`` rule (``imaging.fit_to_budget``: sides multiples of ``factor``, scaled down into
``max_pixels`` or up to ``min_pixels``). So the answer's size is a fixed point of the client's
own resize when it uses the same band and factor, and always lands inside the band.

Invariant: every function here is deterministic arithmetic on numbers; no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..contract import MIN_CROP_SOURCE_SIDE, crop_band_problem
from ..storage.imaging import center_window, fit_to_budget, render_scale

MAX_PDF_DPI = 600
MAX_PDF_SCALE = MAX_PDF_DPI / 72  # pixels per point at most, rendering from a PDF
IMAGE_SCALE = 1.0  # a stored page image is never upscaled beyond its pixels by choice


@dataclass(frozen=True)
class Band:
    """The caller's pixel band for one request's crops, and the side multiple (28 for
    Qwen2/2.5-VL, 32 for Qwen3-VL)."""

    min_pixels: int
    max_pixels: int
    factor: int


def band_problem(band: Band, max_pixels_limit: int) -> str | None:
    """Why the request's band cannot be served (a request-level problem), or None."""
    if problem := crop_band_problem(band.min_pixels, band.max_pixels, band.factor):
        return problem
    if band.max_pixels > max_pixels_limit:
        return f"max_pixels {band.max_pixels} is over this server's limit of {max_pixels_limit}"
    return None


Window = tuple[float, float, float, float]  # (left, top, right, bottom), origin top left


def region(box, window: Window) -> Window:
    """The part of ``window`` (what the page image shows of its source, in the source's units)
    that ``box`` names: (left, top, right, bottom) in the source's units."""
    x0, y0, x1, y1 = window
    w, h = x1 - x0, y1 - y0
    return x0 + box[0] * w, y0 + box[1] * h, x0 + box[2] * w, y0 + box[3] * h


def stored_window(width_pt: float, height_pt: float, size: tuple[int, int]) -> Window:
    """What the stored image of a PDF page shows of it, in points: the indexer renders the page
    at ``imaging.render_scale`` and trims the excess of the 28-grid evenly from two margins
    (``imaging.center_window``; under a point or two). Boxes are fractions of the image the
    model saw, so a crop maps them through the same window."""
    scale = render_scale(width_pt, height_pt, size)
    # The size pypdfium2 gives that render (its own arithmetic: ceil of points x scale).
    window = center_window((math.ceil(width_pt * scale), math.ceil(height_pt * scale)), size)
    if window is None:
        return 0.0, 0.0, width_pt, height_pt
    return tuple(v / scale for v in window)  # type: ignore[return-value]


def source_problem(region_width: float, region_height: float, unit: str) -> str | None:
    """Why a region is too small at its source to be worth a crop (a sliver of a few points or
    pixels holds nothing to read), or None."""
    if min(region_width, region_height) >= MIN_CROP_SOURCE_SIDE:
        return None
    return (f"box is too small: it covers {region_width:.1f} x {region_height:.1f} {unit}; each "
            f"side must cover at least {MIN_CROP_SOURCE_SIDE} {unit}")


def crop_size(region_width: float, region_height: float, band: Band,
              max_scale: float) -> tuple[int, int]:
    """(width, height) in pixels of a crop of a region of that size at its source (see the
    module docstring): inside the band, sides multiples of ``band.factor``."""
    scale = min(max_scale, math.sqrt(band.max_pixels / (region_width * region_height)))
    return fit_to_budget(region_width * scale, region_height * scale, band.min_pixels,
                         band.max_pixels, band.factor)


def pdf_margins(part: Window, width_pt: float, height_pt: float) -> tuple[float, float, float, float]:
    """The margins (left, bottom, right, top), in points, that leave only ``part`` (points,
    origin top left) of a page of ``width_pt`` x ``height_pt`` as displayed: pypdfium2's
    ``render(crop=...)``."""
    left, top, right, bottom = part
    return left, height_pt - bottom, width_pt - right, top
