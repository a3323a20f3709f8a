import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from retriever_server.storage.imaging import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, encode_jpeg, fit_to_budget


@settings(max_examples=300, deadline=None)
@given(w=st.floats(10, 20000), h=st.floats(10, 20000))
def test_fit_to_budget_stays_in_band_on_the_patch_grid(w, h):
    tw, th = fit_to_budget(w, h, DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS)
    assert tw % 28 == 0 and th % 28 == 0
    assert tw * th <= DEFAULT_MAX_PIXELS
    # Only very elongated pages can fail to reach the band's floor after rounding to 28s.
    if 0.2 < w / h < 5:
        assert tw * th >= DEFAULT_MIN_PIXELS
        assert abs(tw / th - w / h) / (w / h) < 0.1


def test_sizes_inside_the_band_are_only_rounded_to_the_grid():
    assert fit_to_budget(612, 792, DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS) == (616, 784)


def test_large_scans_shrink_and_small_images_grow_into_the_band():
    w, h = fit_to_budget(2550, 3300, DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS)  # 300 dpi letter
    assert DEFAULT_MAX_PIXELS - 28 * (w + h) < w * h <= DEFAULT_MAX_PIXELS
    w, h = fit_to_budget(300, 400, DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS)
    assert DEFAULT_MIN_PIXELS <= w * h < DEFAULT_MIN_PIXELS + 28 * (w + h) + 28 * 28


def test_fit_to_budget_rejects_bad_arguments():
    with pytest.raises(ValueError):
        fit_to_budget(0, 100, DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS)
    with pytest.raises(ValueError):
        fit_to_budget(100, 100, DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS)


def test_encode_jpeg_resizes_and_converts():
    image = Image.new("RGBA", (300, 200), (10, 200, 30, 255))
    data = encode_jpeg(image, (56, 28), 80)
    decoded = Image.open(io.BytesIO(data))
    assert decoded.format == "JPEG" and decoded.size == (56, 28) and decoded.mode == "RGB"
