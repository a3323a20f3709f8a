"""vision.py against the real Qwen VL image processor (the oracle for grids and token counts), in
Qwen2/2.5-VL geometry (patch 14) and Qwen3-VL geometry (patch 16, 32 px a merged token)."""

from __future__ import annotations

import base64
import io
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw
from transformers import Qwen2VLImageProcessor

from vrag_rollout.core.vision import (
    ImageDecodeError,
    PageImage,
    PixelBand,
    decode_base64_image,
    decode_page,
    decode_page_file,
    fit_to_band,
    page_band,
)

P = 28 * 28
TINY_BAND = PixelBand(4 * P, 256 * P)  # a small band (4 to 256 visual tokens)
RELEASED_BAND = PixelBand(4 * P, 16384 * P)  # Qwen2-VL's released processor limits, the tiny model's too
ROLLOUT_BAND = PixelBand(256 * P, 512 * P)  # VRAG's page band
P3 = 32 * 32
QWEN3_BAND = PixelBand(256 * P3, 512 * P3, patch_size=16)  # the same band in Qwen3-VL tokens

_processors: dict[tuple[int, int, int], Qwen2VLImageProcessor] = {}


def processor_for(band: PixelBand) -> Qwen2VLImageProcessor:
    key = (band.min_pixels, band.max_pixels, band.patch_size)
    if key not in _processors:
        _processors[key] = Qwen2VLImageProcessor(
            size={"shortest_edge": key[0], "longest_edge": key[1]}, patch_size=band.patch_size
        )
    return _processors[key]


def processed(image: Image.Image, band: PixelBand) -> tuple[tuple[int, int, int], int]:
    out = processor_for(band)(images=[image], return_tensors="pt")
    return tuple(out["image_grid_thw"][0].tolist()), out["pixel_values"].shape[0]


bands = st.one_of(
    st.sampled_from([TINY_BAND, ROLLOUT_BAND, QWEN3_BAND]),
    st.tuples(st.integers(1, 400), st.integers(1, 400), st.sampled_from([14, 16])).map(
        lambda t: _band_or_none(min(t[:2]) * (2 * t[2]) ** 2, max(t[:2]) * (2 * t[2]) ** 2, t[2])
    ).filter(lambda b: b is not None),
)


def _band_or_none(lo: int, hi: int, patch: int = 14) -> PixelBand | None:
    try:
        return PixelBand(lo, hi, patch_size=patch)
    except ValueError:  # e.g. [281, 281] merged patches: only a 1x281 strip, ratio > 200
        return None


@st.composite
def sizes(draw):
    short = draw(st.integers(1, 1000))
    ratio = draw(st.one_of(st.floats(1, 3), st.floats(1, 200)))
    # Area capped at ~2 Mpx to keep the real processor fast; extremes come from the ratio.
    long_ = max(short, min(int(short * ratio), 200 * short, 2_000_000 // short))
    return (long_, short) if draw(st.booleans()) else (short, long_)


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(size=sizes(), band=bands)
@example(size=(1100, 850), band=ROLLOUT_BAND)  # a letter page
@example(size=(27036, 162), band=TINY_BAND)  # the processor's own choice (5768x28) exceeds ratio 200
@example(size=(5873, 34), band=ROLLOUT_BAND)
@example(size=(1, 1), band=TINY_BAND)
@example(size=(13, 2600), band=TINY_BAND)  # a side under half a patch
@example(size=(1100, 850), band=QWEN3_BAND)
def test_grid_matches_the_processor(size, band):
    h, w = size
    image = Image.new("RGB", (w, h), (200, 180, 160))
    page = fit_to_band(image, band)
    assert page.image.mode == "RGB"
    assert page.grid_thw[0] == 1
    patch = band.patch_size
    assert (page.image.height, page.image.width) == (page.grid_thw[1] * patch, page.grid_thw[2] * patch)

    # What the actor does: re-process the page we send. Must be a fixed point: same grid.
    grid, rows = processed(page.image, band)
    assert grid == page.grid_thw
    assert page.num_tokens == rows // band.merge_size**2

    # The processor on the original page agrees too, whenever its own choice survives
    # re-processing (it does not for a few extreme strips; then only the fixed point matters).
    try:
        orig_grid, _ = processed(image, band)
        own = image.resize((orig_grid[2] * patch, orig_grid[1] * patch))
        stable = processed(own, band)[0] == orig_grid
    except ValueError:  # the processor refuses ratios > 200
        stable = False
    if stable:
        assert page.grid_thw == orig_grid


def test_extreme_strip_beyond_processor_ratio_still_fits():
    page = fit_to_band(Image.new("RGB", (60, 20000)), TINY_BAND)  # ratio 333: processor refuses the original
    grid, rows = processed(page.image, TINY_BAND)
    assert grid == page.grid_thw and page.num_tokens == rows // 4


def test_fit_keeps_a_fixed_point_unchanged():
    img = Image.new("RGB", (28 * 20, 28 * 16), "white")  # 320 merged patches: inside [256, 512]
    page = fit_to_band(img, ROLLOUT_BAND)
    assert page.image is img and page.grid_thw == (1, 32, 40) and page.num_tokens == 320


def _doc_image(w: int, h: int) -> Image.Image:
    """A smooth page with text and thin lines: resampling filters differ little on it."""
    img = Image.linear_gradient("L").resize((w, h)).convert("RGB")
    d = ImageDraw.Draw(img)
    for y in range(0, h, 40):
        d.text((20, y + 5), "revenue 2024 table figure", fill=(0, 0, 120))
        d.rectangle((w // 2, y, w // 2 + 60, y + 25), outline="red", width=2)
    return img


def _mad(a, b) -> float:
    """Mean absolute difference of two HxWx3 images (PIL or arrays), in 0..255 levels."""
    return float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).mean())


@pytest.mark.parametrize("size, band", [((300, 170), TINY_BAND), ((850, 1100), ROLLOUT_BAND), ((1700, 2200), ROLLOUT_BAND)])
def test_resized_pixels_close_to_the_processors_own_resize(size, band):
    # Our resize need not be torchvision's bicubic (vLLM and the actor get our image, a fixed
    # point of the processor's resize): the size must be exact, the content only close.
    from torchvision.transforms.v2 import functional as F

    img = _doc_image(*size)
    page = fit_to_band(img, band)
    h, w = page.image.height, page.image.width
    assert (w, h) != img.size and page.image.mode == "RGB"
    expected = F.resize(F.pil_to_tensor(img), [h, w], interpolation=F.InterpolationMode.BICUBIC, antialias=True)
    assert _mad(page.image, expected.permute(1, 2, 0).numpy()) < 1.5


def test_page_image_num_tokens():
    assert PageImage(Image.new("RGB", (28, 28)), (1, 4, 6)).num_tokens == 6
    assert PageImage(Image.new("RGB", (28, 28)), (2, 4, 6), merge_size=1).num_tokens == 48


# --------------------------------------------------------------------------- PixelBand


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(min_pixels=0, max_pixels=1000),
        dict(min_pixels=2000, max_pixels=1000),
        dict(min_pixels=10, max_pixels=700),  # below one 28x28 merged patch
        dict(min_pixels=281 * P, max_pixels=281 * P),  # only a 1x281 strip fits: ratio > 200
        dict(min_pixels=1.5, max_pixels=1000),
        dict(min_pixels=True, max_pixels=1000),
        dict(min_pixels=100, max_pixels=1000, patch_size=0),
        dict(min_pixels=100, max_pixels=1000, merge_size=-2),
    ],
)
def test_band_rejects_nonsense(kwargs):
    with pytest.raises(ValueError, match="PixelBand"):
        PixelBand(**kwargs)


def test_band_factor():
    assert PixelBand(P, 4 * P).factor == 28
    assert PixelBand(P, 4 * P, patch_size=16).factor == 32


def test_band_from_processor(tiny_model_dir):
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(tiny_model_dir)
    assert PixelBand.from_processor(proc) == RELEASED_BAND
    assert PixelBand.from_processor(proc.image_processor, 16 * P, 64 * P) == PixelBand(16 * P, 64 * P)
    with pytest.raises(ValueError, match="inside the image processor's own band"):
        PixelBand.from_processor(proc, 256 * P, 32768 * P)  # max above the processor's 16384*28*28
    with pytest.raises(ValueError, match="inside"):
        PixelBand.from_processor(proc, min_pixels=P)

    ip16 = Qwen2VLImageProcessor(size={"shortest_edge": 1024, "longest_edge": 1024 * 64}, patch_size=16)
    band = PixelBand.from_processor(ip16)
    assert (band.patch_size, band.factor, band.min_pixels, band.max_pixels) == (16, 32, 1024, 65536)


def test_page_band_defaults_to_the_same_token_band_in_every_geometry():
    """Unset bounds mean 256..512 visual tokens of the model itself, inside the processor's band."""
    wide = {"shortest_edge": 4 * 1024, "longest_edge": 16384 * 1024}
    ip14 = Qwen2VLImageProcessor(size=wide, patch_size=14)
    ip16 = Qwen2VLImageProcessor(size=wide, patch_size=16)
    assert page_band(ip14) == PixelBand(256 * P, 512 * P)
    assert page_band(ip16) == PixelBand(256 * P3, 512 * P3, patch_size=16)
    assert page_band(ip16, max_pixels=300 * P3) == PixelBand(256 * P3, 300 * P3, patch_size=16)
    assert page_band(ip16, min_pixels=600 * P3) == PixelBand(600 * P3, 600 * P3, patch_size=16)
    narrow = Qwen2VLImageProcessor(size={"shortest_edge": 4 * P, "longest_edge": 300 * P})
    assert page_band(narrow) == PixelBand(256 * P, 300 * P)  # clipped into the processor's own band
    with pytest.raises(ValueError, match="inside the image processor's own band"):
        page_band(narrow, max_pixels=400 * P)  # an explicit bound is never clipped silently


def test_band_from_transformers4_style_processor():
    old = SimpleNamespace(size={"min_pixels": 3136, "max_pixels": 200704}, patch_size=14, merge_size=2, temporal_patch_size=2)
    assert PixelBand.from_processor(old) == PixelBand(3136, 200704)
    attrs = SimpleNamespace(min_pixels=3136, max_pixels=200704, patch_size=14, merge_size=2, temporal_patch_size=2)
    assert PixelBand.from_processor(attrs) == PixelBand(3136, 200704)


# --------------------------------------------------------------------------- base64


def _noise_image(w=61, h=47, mode="RGB", seed=0) -> Image.Image:
    rng = random.Random(seed)
    return Image.frombytes(mode, (w, h), bytes(rng.randrange(256) for _ in range(w * h * len(mode))))


def _encoded(fmt="PNG", **kw) -> tuple[bytes, Image.Image]:
    img = _noise_image(**kw)
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue(), img


def test_decode_standard_urlsafe_unpadded_whitespace():
    raw, img = _encoded("PNG")
    std = base64.b64encode(raw).decode()
    url = base64.urlsafe_b64encode(raw).decode()
    assert ("+" in std or "/" in std) and url != std  # the alphabets really differ here
    assert std.endswith("=")  # so dropping padding is a real case
    wrapped = "\n".join(std[i : i + 76] for i in range(0, len(std), 76)) + "\n  "
    for variant in (std, url, std.rstrip("="), url.rstrip("="), wrapped, std.encode(), "data:image/png;base64," + std):
        out = decode_base64_image(variant)
        assert out.mode == "RGB" and out.size == img.size
        assert out.tobytes() == img.tobytes()  # PNG is lossless: exact pixels


def test_decode_jpeg():
    raw, img = _encoded("JPEG")
    out = decode_base64_image(base64.b64encode(raw))
    assert out.size == img.size and out.mode == "RGB"


def test_decode_composites_alpha_on_white_and_converts_gray():
    img = Image.new("RGBA", (4, 4), (0, 0, 0, 0))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    out = decode_base64_image(base64.b64encode(buf.getvalue()).decode())
    assert out.mode == "RGB" and out.getpixel((0, 0)) == (255, 255, 255)
    raw, _ = _encoded("PNG", mode="L")
    assert decode_base64_image(base64.b64encode(raw)).mode == "RGB"


def _truncated_jpeg() -> str:
    raw, _ = _encoded("JPEG", w=200, h=150)
    return base64.b64encode(raw[: len(raw) // 2]).decode()


@pytest.mark.parametrize(
    "data, fragment",
    [
        ("", "empty"),
        ("   \n", "empty"),
        (b"", "empty"),
        ("====", "empty"),
        ("not an image!!", "not base64"),
        ("abcde", "impossible length"),
        (base64.b64encode(b"hello, this is text not pixels").decode(), "does not decode"),
        (_truncated_jpeg(), "does not decode"),
        ("\u00e9t\u00e9AAA=".encode("utf-8"), "non-ASCII"),
        ("\u00e9t\u00e9AAA=", "non-ASCII"),
        (12345, "str or bytes"),
    ],
)
@pytest.mark.parametrize("decode", [decode_base64_image, lambda data: decode_page(data, TINY_BAND)])
def test_decode_rejects_garbage(data, fragment, decode):
    with pytest.raises(ImageDecodeError, match=fragment) as info:
        decode(data)
    assert isinstance(info.value, ValueError)


# --------------------------------------------------------------------------- decode_page


def _b64(img: Image.Image, fmt: str, **kw) -> str:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize(
    "size, mode, fmt, band",
    [
        ((850, 1100), "RGB", "JPEG", ROLLOUT_BAND),  # the retriever's page: libjpeg-turbo, resized
        ((1700, 2200), "RGB", "JPEG", ROLLOUT_BAND),  # decoded at 1/2 scale in the DCT domain
        ((3400, 4400), "RGB", "JPEG", TINY_BAND),  # 1/8
        ((532, 700), "RGB", "JPEG", ROLLOUT_BAND),  # already at its band size: no resize
        ((300, 170), "L", "JPEG", TINY_BAND),  # grayscale JPEG
        ((20, 9), "RGB", "JPEG", TINY_BAND),  # upscaled
        ((300, 170), "CMYK", "JPEG", TINY_BAND),  # PIL's path
        ((300, 170), "RGBA", "PNG", TINY_BAND),  # PIL's path
    ],
)
def test_decode_page_equals_decode_then_fit(size, mode, fmt, band):
    data = _b64(_doc_image(*size).convert(mode), fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    page = decode_page(data, band)
    slow = fit_to_band(decode_base64_image(data), band)
    assert page.grid_thw == slow.grid_thw and page.num_tokens == slow.num_tokens
    assert page.image.mode == "RGB" and page.image.size == slow.image.size
    assert page.image.size == (page.grid_thw[2] * 14, page.grid_thw[1] * 14)
    assert processed(page.image, band)[0] == page.grid_thw  # a fixed point of the processor
    assert _mad(page.image, slow.image) < 2.0  # fast DCT/upsampling and DCT scaling: close


def test_decode_page_leaves_decompression_bombs_to_pil(monkeypatch):
    data = _b64(_doc_image(200, 150), "JPEG")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)  # PIL refuses above twice this
    with pytest.raises(ImageDecodeError, match="does not decode"):
        decode_page(data, TINY_BAND)


def test_decode_page_decodes_jpeg_without_pil(monkeypatch):
    # The fast path really is taken for the retriever's JPEGs (PIL is only the fallback).
    import vrag_rollout.core.vision as vision

    monkeypatch.setattr(vision, "_decode_pil", lambda raw: pytest.fail("JPEG page went through PIL"))
    for mode in ("RGB", "L"):
        page = decode_page(_b64(_doc_image(850, 1100).convert(mode), "JPEG"), ROLLOUT_BAND)
        assert page.grid_thw == (1, 50, 38) and page.image.size == (532, 700)


def test_decode_page_file_decodes_the_image_file_itself():
    # Oracle: PIL opens the same bytes, fit_to_band sizes them (the slow path, independent).
    for fmt in ("JPEG", "PNG"):
        buf = io.BytesIO()
        _doc_image(850, 1100).save(buf, format=fmt)
        raw = buf.getvalue()
        page = decode_page_file(raw, ROLLOUT_BAND)
        slow = fit_to_band(Image.open(io.BytesIO(raw)).convert("RGB"), ROLLOUT_BAND)
        assert page.grid_thw == slow.grid_thw and page.image.size == slow.image.size
        assert _mad(page.image, slow.image) < 2.0


@pytest.mark.parametrize("data, fragment", [(b"", "empty"), (b"\xff\xd8 not a jpeg", "does not decode"),
                                            (base64.b64encode(b"x" * 30), "does not decode"),
                                            ("a str", "must be bytes")])
def test_decode_page_file_rejects_garbage(data, fragment):
    with pytest.raises(ImageDecodeError, match=fragment):
        decode_page_file(data, TINY_BAND)
