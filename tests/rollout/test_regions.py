"""A box in each family's grounding frame (`core/regions.py`) lands on the page region it names.

Oracle: a page image of the size the episode shows (a real band size of the family's processor)
holds a dark mark at a known place; the box a model of that family would write around it is
mapped to page fractions, the region is cut from the page with PIL, and the mark's centre,
measured with numpy, must sit at the centre of the cut. The same box read in the other frame
(relative as absolute, or the reverse) misses: the test can fail.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw

from vrag_rollout.core.regions import (ABSOLUTE, RELATIVE_1000, Region, RegionError, from_fractions, parse_region,
                                       to_fractions)
from vrag_rollout.core.vision import band_size, page_band
from vrag_rollout.families import FAMILY_NAMES, family_by_name

MARK = Region(0.62, 0.30, 0.70, 0.36)  # where the mark sits, as fractions of the page


def shown_page(processor) -> Image.Image:
    """A letter-size page at the size the family's processor shows it in the default page band."""
    band = page_band(processor)
    height, width = band_size(1100, 850, band)
    page = Image.new("RGB", (width, height), "white")
    box = [MARK.x1 * width, MARK.y1 * height, MARK.x2 * width, MARK.y2 * height]
    ImageDraw.Draw(page).rectangle(box, fill="black")
    return page


def mark_centre(image: Image.Image) -> tuple[float, float]:
    dark = np.asarray(image.convert("L")) < 128
    ys, xs = np.nonzero(dark)
    return (xs.mean() + 0.5) / image.width, (ys.mean() + 0.5) / image.height


def cut(page: Image.Image, region: Region) -> Image.Image:
    return page.crop((round(region.x1 * page.width), round(region.y1 * page.height),
                      round(region.x2 * page.width), round(region.y2 * page.height)))


def model_box(frame: str, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """The box a model writes around the mark with a margin, in its frame."""
    around = Region(MARK.x1 - 0.05, MARK.y1 - 0.05, MARK.x2 + 0.05, MARK.y2 + 0.05)
    return from_fractions(around, frame, size)


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def family_page(request):
    from transformers import AutoProcessor

    from vrag_rollout.devkit.tiny_model import build_tiny_model, default_model_dir

    processor = AutoProcessor.from_pretrained(build_tiny_model(default_model_dir(request.param), request.param))
    return family_by_name(request.param), shown_page(processor)


def test_the_familys_box_centres_the_mark(family_page):
    family, page = family_page
    assert family.grounding_frame == (ABSOLUTE if family.name == "qwen2.5-vl" else RELATIVE_1000)
    box = model_box(family.grounding_frame, page.size)
    region = to_fractions(box, family.grounding_frame, page.size)
    x, y = mark_centre(cut(page, region))
    assert abs(x - 0.5) < 0.03 and abs(y - 0.5) < 0.03, (family.name, box, x, y)


def test_a_box_read_in_the_other_frame_misses(family_page):
    family, page = family_page
    box = model_box(family.grounding_frame, page.size)
    other = RELATIVE_1000 if family.grounding_frame == ABSOLUTE else ABSOLUTE
    try:
        region = to_fractions(box, other, page.size)
    except RegionError:
        return  # refused outright: also not the mark
    crop = cut(page, region)
    dark = np.asarray(crop.convert("L")) < 128
    if dark.any():
        x, y = mark_centre(crop)
        assert abs(x - 0.5) > 0.1 or abs(y - 0.5) > 0.1, (family.name, box)


@pytest.mark.parametrize("box, words", [
    ((10, 10, 5, 20), "empty or inverted"), ((10, 10, 10, 20), "empty or inverted"),
    ((0, 0, 1200, 500), "outside the page"), ((-50, 0, 100, 100), "outside the page"),
    ((float("nan"), 0, 100, 100), "not finite"), ((0, 0, 100), "4 numbers"),
    ((100, 100, 105, 400), "too small"),
])
def test_bad_boxes_are_refused_with_what_is_wrong(box, words):
    with pytest.raises(RegionError, match=words):
        to_fractions(box, RELATIVE_1000)


def test_absolute_boxes_need_the_shown_size_and_rounding_overshoot_is_clamped():
    with pytest.raises(RegionError, match="size of the image as shown"):
        to_fractions((0, 0, 10, 10), ABSOLUTE)
    assert to_fractions((0, 0, 1000.5, 1000), RELATIVE_1000) == Region(0.0, 0.0, 1.0, 1.0)
    assert to_fractions((0, 0, 448, 224), ABSOLUTE, (448, 448)) == Region(0.0, 0.0, 1.0, 0.5)


@pytest.mark.parametrize("body, expected", [
    ("3, [100, 200, 300, 400]", (3, (100.0, 200.0, 300.0, 400.0))),
    (" 12 ,[1.5,2,3e2, 4 ] ", (12, (1.5, 2.0, 300.0, 4.0))),
    ("[10, 20, 30, 40]", (None, (10.0, 20.0, 30.0, 40.0))),  # VRAG-RL's <bbox> form: the last page shown
])
def test_parse_region(body, expected):
    assert parse_region(body) == expected


@pytest.mark.parametrize("body, words", [("0, [1, 2, 3, 4]", "count from 1"), ("3, (1, 2, 3, 4)", "write the region"),
                                         ("3, [1, 2, 3]", "write the region"), ("page 3", "write the region")])
def test_parse_region_refuses_malformed_bodies(body, words):
    with pytest.raises(RegionError, match=words):
        parse_region(body)


def test_parse_action_reads_the_region_action_only_when_it_is_on():
    from vrag_rollout.core.actions import Crop, Invalid, Stop, parse_action

    text = "<think>look closer</think><crop>3, [100, 200, 300, 400]</crop>"
    assert parse_action(text, "stop", "</crop>", regions=True) == Crop(3, (100.0, 200.0, 300.0, 400.0))
    assert parse_action("<bbox>[1, 2, 300, 400]</bbox>", "stop", "</bbox>", regions=True) == Crop(
        None, (1.0, 2.0, 300.0, 400.0))
    bad = parse_action("<crop>[1, 2, 300, 400]</crop>", "stop", "</crop>", regions=True)
    assert isinstance(bad, Invalid) and bad.kind == "bad_region" and "<crop>page," in bad.message
    assert parse_action(text, "stop", "</crop>", regions=False) == Stop("eos")  # off: not an action


def test_resolve_reads_the_box_against_the_page_as_shown():
    from types import SimpleNamespace

    from vrag_rollout.core.regions import resolve

    shown = {"doc_2": SimpleNamespace(image=Image.new("RGB", (400, 600)))}
    request = resolve(2, (100, 150, 300, 450), ABSOLUTE, "doc", shown, "doc_2")
    assert (request.page, request.page_id, request.region) == (2, "doc_2", Region(0.25, 0.25, 0.75, 0.75))
    assert resolve(None, (0, 0, 500, 500), RELATIVE_1000, "doc", shown, "doc_2").page == 2  # <bbox>: the last page
    with pytest.raises(RegionError, match="page 3 has not been shown"):
        resolve(3, (0, 0, 500, 500), RELATIVE_1000, "doc", shown, "doc_2")
    with pytest.raises(RegionError, match="no page has been shown"):
        resolve(None, (0, 0, 500, 500), RELATIVE_1000, "doc", {}, None)
