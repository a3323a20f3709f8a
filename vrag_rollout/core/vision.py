"""Retrieved page images: decode base64, resize into a pixel band, and know the grid, cheaply.

The rollout must know how many `<|image_pad|>` tokens a page becomes without running the image
processor (about 20 ms of CPU a page, and the seed implementation ran it twice). It resizes each page once to a size the processor leaves
untouched (a fixed point of its resize), so the grid computed here is exactly the grid the
trainer's actor will compute when it re-processes the same page.

`decode_page` is the hot path (base64 page -> PageImage; `decode_page_file` for the JPEG bytes of
a binary retriever answer): libjpeg-turbo (simplejpeg) decodes the
JPEG straight into an RGB array and OpenCV resizes it, about 5x cheaper than the image processor
run twice; PIL handles every other format and explains every undecodable one.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import cv2
import numpy as np
import simplejpeg
from PIL import Image

# The processor's own resize rule; the grids must agree with what the actor computes. (The copy
# in qwen-vl-utils follows the same rule for real pages but picks other sizes for images with a
# side under one patch, e.g. 1x1, where the processor's grid is the one that counts.)
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

from .pages import PageEntry

MAX_ASPECT_RATIO = 200  # Qwen2-VL's processor raises above this


class ImageDecodeError(ValueError):
    """Bytes that are not a decodable image (bad base64, empty, truncated, unknown format)."""


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"PixelBand.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class PixelBand:
    """Pixel-count band [min_pixels, max_pixels] for page images, plus the vision patch geometry."""

    min_pixels: int
    max_pixels: int
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2

    def __post_init__(self) -> None:
        for name in ("min_pixels", "max_pixels", "patch_size", "merge_size", "temporal_patch_size"):
            _positive_int(name, getattr(self, name))
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"PixelBand: min_pixels {self.min_pixels} > max_pixels {self.max_pixels}")
        if self.max_pixels < self.factor**2:
            raise ValueError(
                f"PixelBand: max_pixels {self.max_pixels} is below one merged patch "
                f"({self.factor}x{self.factor} = {self.factor**2} pixels); no image fits"
            )
        if not _fixed_point_grids(self, max_count=1):
            raise ValueError(
                f"PixelBand: no image of {self.factor}-multiple sides with aspect ratio <= {MAX_ASPECT_RATIO} "
                f"has between {self.min_pixels} and {self.max_pixels} pixels"
            )

    @property
    def factor(self) -> int:
        """Side of one merged patch in pixels: image sides are multiples of it."""
        return self.patch_size * self.merge_size

    @classmethod
    def from_processor(cls, processor: Any, min_pixels: int | None = None, max_pixels: int | None = None) -> PixelBand:
        """Band from a Qwen VL processor or image processor, optionally narrowed.

        The band must lie inside the processor's own [min_pixels, max_pixels]: the actor
        re-processes pages with that processor, and only sizes inside its band are left
        unchanged by its resize (otherwise the grids, and the image token counts, disagree).
        """
        ip = getattr(processor, "image_processor", None) or processor
        p_min, p_max = _processor_pixel_limits(ip)
        lo = p_min if min_pixels is None else min_pixels
        hi = p_max if max_pixels is None else max_pixels
        if not (p_min <= lo and hi <= p_max):
            raise ValueError(
                f"pixel band [{lo}, {hi}] must lie inside the image processor's own band [{p_min}, {p_max}]: "
                "the actor re-processes pages with that processor, and a page outside its band would be "
                "resized again, giving a different grid than the rollout's image tokens"
            )
        return cls(
            min_pixels=lo,
            max_pixels=hi,
            patch_size=int(ip.patch_size),
            merge_size=int(ip.merge_size),
            temporal_patch_size=int(ip.temporal_patch_size),
        )


def page_band(processor: Any, min_pixels: int | None = None, max_pixels: int | None = None) -> PixelBand:
    """The band result pages are resized into, for this model's processor.

    Pixel counts that are given are used as they are (and must lie inside the processor's own
    band). One that is not given defaults to DEFAULT_PAGE_MIN/MAX_TOKENS visual tokens of this
    model, i.e. times its (patch * merge)^2, clipped into the processor's own band: a Qwen3-VL
    page then gets as many tokens as a Qwen2-VL page, not 30% fewer.
    """
    from ..config import DEFAULT_PAGE_MAX_TOKENS, DEFAULT_PAGE_MIN_TOKENS

    ip = getattr(processor, "image_processor", None) or processor
    p_min, p_max = _processor_pixel_limits(ip)
    unit = (int(ip.patch_size) * int(ip.merge_size)) ** 2
    if max_pixels is None:
        floor = p_min if min_pixels is None else min_pixels
        max_pixels = max(floor, min(p_max, DEFAULT_PAGE_MAX_TOKENS * unit))
    if min_pixels is None:
        min_pixels = min(max_pixels, max(p_min, DEFAULT_PAGE_MIN_TOKENS * unit))
    return PixelBand.from_processor(processor, min_pixels=min_pixels, max_pixels=max_pixels)


def _field(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def _processor_pixel_limits(ip: Any) -> tuple[int, int]:
    """(min_pixels, max_pixels) of an image processor across transformers 4.x / 5.x spellings."""
    size = getattr(ip, "size", None)
    lo = _field(size, "shortest_edge") or _field(size, "min_pixels") or getattr(ip, "min_pixels", None)
    hi = _field(size, "longest_edge") or _field(size, "max_pixels") or getattr(ip, "max_pixels", None)
    if not lo or not hi:
        raise ValueError(f"cannot read min/max pixels from {type(ip).__name__} (size={size!r})")
    return int(lo), int(hi)


# --------------------------------------------------------------------------- base64 decoding

_B64_BYTES = re.compile(rb"[A-Za-z0-9+/]*")
_DATA_URL = re.compile(rb"^data:[^,]*;base64,", re.IGNORECASE)


def _b64_bytes(data: str | bytes) -> bytes:
    """Decode standard or URL-safe base64, ignoring whitespace and missing padding."""
    if isinstance(data, str):
        buf = data.encode("utf-8")
    elif isinstance(data, (bytes, bytearray, memoryview)):
        buf = bytes(data)
    else:
        raise ImageDecodeError(f"image data must be str or bytes, got {type(data).__name__}")
    if not buf.isascii():
        raise ImageDecodeError("image data is not base64 text (non-ASCII characters)")
    try:  # fast path: canonical standard base64 (what the retriever emits)
        raw = base64.b64decode(buf, validate=True)
        if raw:
            return raw
    except binascii.Error:
        pass
    text = _DATA_URL.sub(b"", b"".join(buf.split()))
    # Python's b64decode silently drops '-' and '_'; map URL-safe to standard explicitly.
    text = text.translate(bytes.maketrans(b"-_", b"+/")).rstrip(b"=")
    if not text:
        raise ImageDecodeError("image data is empty")
    if not _B64_BYTES.fullmatch(text):
        bad = sorted(set(re.sub(rb"[A-Za-z0-9+/]", b"", text).decode()))[:5]
        raise ImageDecodeError(f"image data is not base64: unexpected characters {bad}")
    if len(text) % 4 == 1:
        raise ImageDecodeError(f"image data is not base64: impossible length {len(text)} (truncated?)")
    try:
        return base64.b64decode(text + b"=" * (-len(text) % 4), validate=True)
    except binascii.Error as e:
        raise ImageDecodeError(f"image data is not base64: {e}") from e


def _has_alpha(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info)


def _to_rgb(image: Image.Image) -> Image.Image:
    """RGB, with transparency composited onto white (a transparent page is a white page)."""
    if image.mode == "RGB":
        return image
    if _has_alpha(image):
        rgba = image.convert("RGBA")
        canvas = Image.new("RGB", rgba.size, (255, 255, 255))
        canvas.paste(rgba, mask=rgba.getchannel("A"))
        return canvas
    return image.convert("RGB")


def decode_base64_image(data: str | bytes) -> Image.Image:
    """Base64 (standard or URL-safe, padding optional) -> fully loaded RGB PIL image.

    Raises ImageDecodeError for anything that is not a complete, decodable image; never None.
    """
    return _decode_pil(_b64_bytes(data))[0]


def _decode_pil(raw: bytes) -> tuple[Image.Image, bool]:
    """(RGB image, whether it has no transparency: then it is exactly what a plain
    `Image.open(raw).convert("RGB")`, the trainers' reading, gives)."""
    try:
        with Image.open(io.BytesIO(raw)) as img:
            img.load()  # decode every pixel now: truncated files fail here, not later
            if img.width < 1 or img.height < 1:
                raise ImageDecodeError(f"image has no pixels ({img.width}x{img.height})")
            return _to_rgb(img), not _has_alpha(img)  # loaded: usable after the file closes
    except ImageDecodeError:
        raise
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError...
        raise ImageDecodeError(f"image data ({len(raw)} bytes) does not decode as an image: {e}") from e


# --------------------------------------------------------------------------- resizing


@dataclass(frozen=True)
class PageImage:
    """A page resized into the band, with the grid the processor will compute for it."""

    image: Image.Image  # RGB, already resized: send exactly this to vLLM
    grid_thw: tuple[int, int, int]  # in patches (t, h/patch, w/patch)
    merge_size: int = 2
    # What the batch holds for the trainer: the page's bytes, whose pixels are `image` (the
    # retriever's own bytes when they are; else lossless PNG of `image`).
    entry: Optional[PageEntry] = None

    def __post_init__(self) -> None:
        if self.entry is None:
            object.__setattr__(self, "entry", PageEntry.of_image(self.image))

    @property
    def num_tokens(self) -> int:
        """Number of `<|image_pad|>` tokens the page occupies (t*h*w / merge^2)."""
        t, h, w = self.grid_thw
        return t * h * w // (self.merge_size * self.merge_size)


def _is_fixed_point(height: int, width: int, band: PixelBand) -> bool:
    """True if the processor's resize leaves (height, width) unchanged (and does not raise)."""
    f = band.factor
    return (
        height >= f
        and width >= f
        and height % f == 0
        and width % f == 0
        and band.min_pixels <= height * width <= band.max_pixels
        and max(height, width) <= MAX_ASPECT_RATIO * min(height, width)
    )


def _fixed_point_grids(band: PixelBand, aspect: float = 1.0, max_count: int | None = None) -> list[tuple[int, int]]:
    """(short, long) side lengths in merged patches that the processor leaves unchanged, one per
    short side: the long side closest to ``aspect`` within the band and the ratio limit."""
    f2 = band.factor**2
    lo_units, hi_units = math.ceil(band.min_pixels / f2), band.max_pixels // f2
    found = []
    for short in range(1, math.isqrt(hi_units) + 1):
        lo = max(short, math.ceil(lo_units / short))
        hi = min(MAX_ASPECT_RATIO * short, hi_units // short)
        if lo <= hi:
            found.append((short, min(max(round(short * aspect), lo), hi)))
            if max_count is not None and len(found) >= max_count:
                break
    return found


def _nearest_fixed_point(height: int, width: int, band: PixelBand) -> tuple[int, int]:
    """Fixed-point size closest in aspect ratio (then largest) for pages the processor's own
    choice cannot handle, e.g. a 162x27036 strip becomes 28x5768, whose ratio exceeds 200."""
    aspect = max(height, width) / min(height, width)
    # Non-empty: PixelBand's validation guarantees at least one fixed point.
    short, long_ = min(
        _fixed_point_grids(band, aspect), key=lambda sl: (abs(math.log(sl[1] / sl[0] / aspect)), -sl[0] * sl[1])
    )
    short, long_ = short * band.factor, long_ * band.factor
    return (long_, short) if height >= width else (short, long_)


def band_size(height: int, width: int, band: PixelBand) -> tuple[int, int]:
    """(height, width) a page of this size is resized to: the processor's own choice when that
    is a fixed point of its resize (virtually always), else the nearest size that is."""
    if height < 1 or width < 1:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if max(height, width) <= MAX_ASPECT_RATIO * min(height, width):
        h, w = smart_resize(height, width, factor=band.factor, min_pixels=band.min_pixels, max_pixels=band.max_pixels)
        if _is_fixed_point(h, w, band):
            return h, w
    return _nearest_fixed_point(height, width, band)


def _resize(pixels: np.ndarray, height: int, width: int) -> Image.Image:
    """RGB uint8 array -> RGB image of exactly (height, width).

    The pixels need not match the processor's own (torchvision bicubic) resize: vLLM and the
    actor both receive this image, whose size the processor leaves unchanged. OpenCV's SIMD
    bilinear is ~4x cheaper than torch's or PIL's antialiased filters and, shrinking by less
    than 2x, still lets every source pixel count; beyond 2x, INTER_AREA averages instead.
    """
    if pixels.shape[:2] != (height, width):
        shrink = pixels.shape[0] >= 2 * height or pixels.shape[1] >= 2 * width
        pixels = cv2.resize(pixels, (width, height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
    return Image.fromarray(pixels)


def _page(image: Image.Image, band: PixelBand, entry: Optional[PageEntry] = None) -> PageImage:
    """A still image is one temporal patch (the processor repeats it temporal_patch_size times),
    so grid = (1, H/patch, W/patch)."""
    grid = (1, image.height // band.patch_size, image.width // band.patch_size)
    return PageImage(image=image, grid_thw=grid, merge_size=band.merge_size, entry=entry)


def page_of(entry: PageEntry, band: PixelBand) -> PageImage:
    """The page an entry made by this module shows (its image is already in `band`)."""
    return _page(entry.image, band, entry)


def fit_to_band(image: Image.Image, band: PixelBand) -> PageImage:
    """Resize a page into the band (once) and compute its grid without the processor."""
    image = _to_rgb(image)
    height, width = band_size(image.height, image.width, band)
    if (width, height) != image.size:
        image = _resize(np.asarray(image), height, width)
    return _page(image, band)


def decode_page(data: str | bytes, band: PixelBand) -> PageImage:
    """Base64 page (text, or its ASCII bytes) -> PageImage: decode_base64_image + fit_to_band in
    one pass, same errors. A page's JPEG bytes themselves go to `decode_page_file`.

    A JPEG's header gives the band size before any pixel is decoded, so libjpeg-turbo decodes
    it straight to an RGB array (fast DCT and upsampling when shrinking), scaled
    in the DCT domain by 1/2, 1/4 or 1/8 when the page is that much larger than its band size;
    no full-size PIL image is built. Other formats, CMYK JPEGs, pages already at their band
    size (kept as served: `pages.PageEntry`) and broken data go to PIL. (The grid comes from the
    header's size, exactly as fit_to_band computes it.)
    """
    return decode_page_file(_b64_bytes(data), band)


def decode_page_file(raw: bytes, band: PixelBand) -> PageImage:
    """The image file's own bytes (a binary retriever answer: no base64) -> PageImage; what
    `decode_page` does after base64, with the same errors."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise ImageDecodeError(f"image file must be bytes, got {type(raw).__name__}")
    if not raw:
        raise ImageDecodeError("image data is empty")
    page = _shrunk_jpeg(bytes(raw), band)
    if page is not None:
        return page
    image, plain = _decode_pil(raw)
    if plain and band_size(image.height, image.width, band) == (image.height, image.width):
        # Already the page, decoded as the trainers' readers decode it (PIL, whatever JPEG
        # library each side links): the retriever's bytes are the page.
        return _page(image, band, PageEntry(raw, image=image))
    return fit_to_band(image, band)


def _shrunk_jpeg(raw: bytes, band: PixelBand) -> Optional[PageImage]:
    """A JPEG page larger than its band size, decoded by libjpeg-turbo straight into the band;
    None for anything else (not a JPEG, CMYK, a decompression bomb, broken data, or a page
    already at its band size: PIL decodes those, and explains what it cannot decode)."""
    try:
        h, w, colorspace, _ = simplejpeg.decode_jpeg_header(raw)
    except ValueError:
        return None
    if colorspace not in ("YCbCr", "Gray") or h * w > (Image.MAX_IMAGE_PIXELS or math.inf):
        return None
    height, width = band_size(h, w, band)
    if (height, width) == (h, w):
        return None
    k = next((k for k in (8, 4, 2) if -(-h // k) >= height and -(-w // k) >= width), 1)
    fast = h * w > height * width  # shrinking averages the fast DCT's/upsampling's errors away
    try:  # strict: a truncated or corrupt JPEG raises
        pixels = simplejpeg.decode_jpeg(
            raw, fastdct=fast, fastupsample=fast, min_factor=k, min_height=-(-h // k), min_width=-(-w // k))
    except ValueError:
        return None
    return _page(_resize(pixels, height, width), band)


def processor_floor(processor: Any, trainer_min_pixels: Optional[int] = None) -> int:
    """The fewest pixels a page may have: the image processor's own minimum, or the trainer's,
    whichever is larger (a smaller page would be resized again by the actor)."""
    ip = getattr(processor, "image_processor", None) or processor
    return max(_processor_pixel_limits(ip)[0], int(trainer_min_pixels or 0))


def lowered_band(band: PixelBand, max_pixels: int, floor_pixels: int) -> Optional[PixelBand]:
    """`band` with its top lowered to `max_pixels`; below the band's bottom, the bottom goes down
    to `floor_pixels` (never to the top: a one-size band would force a page's shape); `band`
    itself when it already lies below; None when no page fits."""
    if max_pixels >= band.max_pixels:
        return band
    floor = max(floor_pixels, band.factor ** 2)
    if max_pixels < floor:
        return None
    bottom = band.min_pixels if band.min_pixels <= max_pixels else floor
    return dataclasses.replace(band, min_pixels=bottom, max_pixels=max_pixels)


def narrowed_band(band: Any, min_pixels: Optional[int], max_pixels: Optional[int]) -> Any:
    """`band` intersected with the trainer's [min_pixels, max_pixels]; ValueError if disjoint."""
    low = max(band.min_pixels, int(min_pixels or 0))
    high = min(band.max_pixels, int(max_pixels)) if max_pixels else band.max_pixels
    if low > high or high < band.factor**2:
        raise ValueError(
            f"the page pixel band [{band.min_pixels}, {band.max_pixels}] does not overlap the trainer's "
            f"image band [{min_pixels}, {max_pixels}]: set page_min_pixels/page_max_pixels inside it"
        )
    return dataclasses.replace(band, min_pixels=low, max_pixels=high)
