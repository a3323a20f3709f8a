"""Page image sizing and JPEG encoding.

``fit_to_budget`` is pure and follows the rule of Qwen2-VL's ``smart_resize``: round each side to
a multiple of 28 (one visual token per 28x28 patch after merging), then scale down into
``max_pixels`` or up to ``min_pixels`` if the area falls outside the band, keeping the aspect
ratio. A stored page therefore passes through the client's own ``smart_resize`` unchanged when
both use the same band.
"""

from __future__ import annotations

import io
import math

from PIL import Image

PATCH = 28
DEFAULT_MIN_PIXELS = 512 * PATCH * PATCH
DEFAULT_MAX_PIXELS = 1280 * PATCH * PATCH
DEFAULT_JPEG_QUALITY = 85
# PDF pages are rendered at this resolution before fitting into the band. At 72 dpi a US letter
# page is 616 x 784 (~620 visual tokens, ~85 KiB JPEG): VRAG's page size. Raise it (up to
# max_pixels) for documents with small print.
DEFAULT_DPI = 72


def fit_to_budget(width: float, height: float, min_pixels: int, max_pixels: int,
                  factor: int = PATCH) -> tuple[int, int]:
    """(w, h), multiples of ``factor``, near the given size and with area in [min, max]."""
    if not (width > 0 and height > 0):
        raise ValueError(f"page has no area: {width} x {height}")
    if not factor * factor <= min_pixels <= max_pixels:
        raise ValueError(f"need {factor * factor} <= min_pixels <= max_pixels, "
                         f"got {min_pixels}, {max_pixels}")
    w = max(factor, round(width / factor) * factor)
    h = max(factor, round(height / factor) * factor)
    if w * h > max_pixels:
        beta = math.sqrt(width * height / max_pixels)
        w = max(factor, math.floor(width / beta / factor) * factor)
        h = max(factor, math.floor(height / beta / factor) * factor)
    elif w * h < min_pixels:
        beta = math.sqrt(min_pixels / (width * height))
        w = math.ceil(width * beta / factor) * factor
        h = math.ceil(height * beta / factor) * factor
    # Extreme aspect ratios can land outside the band after rounding; nudge the long side.
    while w * h > max_pixels and max(w, h) > factor:
        if w >= h:
            w -= factor
        else:
            h -= factor
    while w * h < min_pixels:
        if w >= h:
            w += factor
        else:
            h += factor
    return w, h


def render_scale(width: float, height: float, size: tuple[int, int]) -> float:
    """The one scale at which a page of ``width`` x ``height`` (points) covers ``size`` on both
    axes: a PDF page is rendered at it, then trimmed to ``size`` (`center_window`)."""
    return max(size[0] / width, size[1] / height)


def center_window(have: tuple[int, int], size: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """The centred ``size`` window (left, top, right, bottom) kept of an image of size ``have``;
    None when the image is kept whole (the same size, or smaller on an axis: resampled)."""
    if have == size or have[0] < size[0] or have[1] < size[1]:
        return None
    left = (have[0] - size[0]) // 2
    top = (have[1] - size[1]) // 2
    return left, top, left + size[0], top + size[1]


def encode_jpeg(image: Image.Image, size: tuple[int, int], quality: int) -> bytes:
    """Resize (when needed) and encode as baseline JPEG, RGB."""
    if image.mode != "RGB":
        image = image.convert("RGB")
    if image.size != size:
        image = image.resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0)
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality, optimize=False)
    return buf.getvalue()
