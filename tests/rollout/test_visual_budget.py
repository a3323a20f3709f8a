"""Visual budgets that keep one sequence: search results as thumbnails, fetched pages at the full
band, and a per-episode visual-token budget that lowers later pages' band as it is spent. Every
grid is checked against the processor's own (a page the actor would resize again is a broken
batch), and with every budget off the observations are exactly what they were."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from vrag_rollout.core.actions import Fetch, Search
from vrag_rollout.core.observation import VISUAL_LIMIT, ObservationBuilder, VisionTokens
from vrag_rollout.core.pages import pixels
from vrag_rollout.core.vision import lowered_band, page_band, processor_floor
from vrag_rollout.retrieval.types import RetrievedPage
from vrag_rollout.rollout.tools import Observer, Room

FULL = (64 * 28 * 28, 256 * 28 * 28)
THUMB = 24 * 28 * 28


def jpeg(width: int, height: int, shade: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (shade, 240, 230)).save(out, format="JPEG")
    return out.getvalue()


PAGES = [RetrievedPage(f"doc_{k}", "doc", k, "image", jpeg(850 + 40 * k, 1100, 200 + k)) for k in range(1, 4)]


@pytest.fixture(scope="module")
def builder(tiny_processor):
    tokenizer = tiny_processor.tokenizer
    return ObservationBuilder(tokenizer, VisionTokens.from_tokenizer(tokenizer))


def observer(builder, processor, search_max=None):
    band = page_band(processor, *FULL)
    floor = processor_floor(processor)
    return Observer(builder, band, search_band=None if search_max is None else lowered_band(band, search_max, floor),
                    floor_pixels=floor)


def processor_tokens(processor, image) -> int:
    """The pad run the processor itself makes of the image as shown (the oracle)."""
    grid = processor.image_processor(images=[pixels(image.entry)], return_tensors="pt")["image_grid_thw"][0]
    return int(grid.prod()) // processor.image_processor.merge_size ** 2


def test_search_results_are_thumbnails_and_a_fetch_is_the_full_page(builder, tiny_processor):
    plain = observer(builder, tiny_processor)
    thumbs = observer(builder, tiny_processor, search_max=THUMB)
    room = Room(10_000, 8)
    (searched,) = thumbs.observe_turn([(Search("q"), PAGES[:2], room)])
    (fetched,) = thumbs.observe_turn([(Fetch("image", 1), PAGES[0], room)])
    (before,) = plain.observe_turn([(Search("q"), PAGES[:2], room)])
    unit = 28 * 28
    for image in searched.observation.images:
        assert image.image.width * image.image.height <= THUMB
        assert image.num_tokens == processor_tokens(tiny_processor, image) <= THUMB // unit
    full = fetched.observation.images[0]
    assert full.num_tokens == processor_tokens(tiny_processor, full) > THUMB // unit
    assert full.grid_thw == before.observation.images[0].grid_thw  # look, then look closer: the page itself
    assert len(searched.observation.trainer_ids) < len(before.observation.trainer_ids)


def test_a_visual_budget_lowers_later_pages_and_then_leaves_them_out(builder, tiny_processor):
    obs = observer(builder, tiny_processor)
    (whole,) = obs.observe_turn([(Search("q"), PAGES, Room(10_000, 8))])
    full_cost = sum(image.num_tokens for image in whole.observation.images)
    left = full_cost // 2  # half of what the three pages cost at the full band
    (shared,) = obs.observe_turn([(Search("q"), PAGES, Room(10_000, 8, left))])
    images = shared.observation.images
    assert len(images) == 3 and sum(image.num_tokens for image in images) <= left
    assert all(image.num_tokens == processor_tokens(tiny_processor, image) for image in images)
    # too little left for even the smallest page the trainer keeps: no image, and the policy is told
    (spent,) = obs.observe_turn([(Search("q"), PAGES, Room(10_000, 8, 2))])
    assert spent.observation.num_images == 0 and spent.observation.dropped_images == 3
    assert VISUAL_LIMIT in builder.decode(spent.observation.trainer_ids)


def test_without_budgets_nothing_changes(builder, tiny_processor):
    obs = observer(builder, tiny_processor)
    (a,) = obs.observe_turn([(Search("q"), PAGES, Room(10_000, 8))])
    (b,) = obs.observe_turn([(Search("q"), PAGES, Room(10_000, 8, None))])
    (c,) = observer(builder, tiny_processor, search_max=None).observe_turn([(Search("q"), PAGES, Room(10_000, 8))])
    assert a.observation.trainer_ids == b.observation.trainer_ids == c.observation.trainer_ids
    assert [i.grid_thw for i in a.observation.images] == [i.grid_thw for i in c.observation.images]


def test_a_thumbnail_band_below_the_trainers_smallest_image_is_refused(tiny_processor):
    band = page_band(tiny_processor, *FULL)
    assert lowered_band(band, 100, processor_floor(tiny_processor, 28 * 28 * 4)) is None
    assert lowered_band(band, FULL[1] * 2, 0) is band


def test_a_lowered_band_keeps_the_pages_shape(builder, tiny_processor):
    """A share below the band's bottom lowers the bottom to the smallest page kept, not to the
    share: a one-size band would force a page's shape (or hold no page at all)."""
    band = page_band(tiny_processor, 256 * 28 * 28, 512 * 28 * 28)
    floor = processor_floor(tiny_processor)
    for tokens in (251, 199, 100):
        lowered = lowered_band(band, tokens * 28 * 28, floor)
        assert lowered.min_pixels == max(floor, 28 * 28) and lowered.max_pixels == tokens * 28 * 28
    obs = Observer(builder, band, floor_pixels=floor)
    (shared,) = obs.observe_turn([(Search("q"), PAGES[:2], Room(10_000, 8, 502))])  # 251 tokens a page
    for image in shared.observation.images:
        assert image.num_tokens <= 251 and image.num_tokens == processor_tokens(tiny_processor, image)
        assert 0.6 < image.image.width / image.image.height < 1.0  # the page's own shape (850 x 1100)


def test_the_native_format_says_the_visual_budget_is_spent(builder, tiny_processor):
    from vrag_rollout.core.tool_turns import TOOLS, ToolTurnTemplate

    template = ToolTurnTemplate(tiny_processor.tokenizer, TOOLS)
    obs = observer(builder, tiny_processor)
    result = obs.observe_tool_turn([Search("q")], [PAGES[:2]], Room(10_000, 8, 2), template)
    text = builder.decode(result.observation.trainer_ids)
    assert result.observation.num_images == 0 and "the visual budget of this episode is spent" in text
