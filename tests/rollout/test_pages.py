"""Page entries: one shared copy per distinct page, whose pixels any reader decodes identically."""

from __future__ import annotations

import base64
import copy
import io
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from tests.rollout.agent_helpers import cover_image
from vrag_rollout.core.pages import PageCache, PageEntry, content_key, pixels
from vrag_rollout.core.vision import PixelBand, decode_page, decode_page_file, fit_to_band
from vrag_rollout.integrations.easyr1.images import build_multi_modal_inputs, sample_cache_keys
from vrag_rollout.integrations.image_inputs import SharedImageInputs

BAND = PixelBand(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)


def encoded(image: Image.Image, fmt: str = "JPEG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def trainers_reading(data: bytes) -> np.ndarray:
    """What EasyR1's and verl's readers make of `{"bytes": data}`: open, convert to RGB."""
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_a_page_served_at_its_band_size_keeps_the_retrievers_bytes():
    raw = encoded(cover_image(1).resize((196, 252)), quality=90)  # 7x9 merged patches: in the band
    page = decode_page_file(raw, BAND)
    assert page.entry["bytes"] == raw
    assert np.array_equal(trainers_reading(raw), np.asarray(page.image))  # what the engine saw, bit for bit


@pytest.mark.parametrize("image, fmt", [
    (cover_image(2).resize((500, 700)), "JPEG"),  # resized into the band
    (cover_image(3).resize((196, 252)).convert("RGBA"), "PNG"),  # transparency composited onto white
])
def test_a_page_the_rollout_changed_is_held_as_lossless_png_of_what_the_engine_saw(image, fmt):
    if image.mode == "RGBA":
        image.putalpha(128)
    page = decode_page_file(encoded(image, fmt), BAND)
    assert page.entry["bytes"].startswith(b"\x89PNG")
    assert np.array_equal(trainers_reading(page.entry["bytes"]), np.asarray(page.image))
    assert np.array_equal(np.asarray(pixels(page.entry)), np.asarray(page.image))


def test_an_entry_pickles_as_its_bytes_and_a_shared_entry_once():
    raw = encoded(cover_image(4).resize((196, 252)), quality=90)
    entry = decode_page_file(raw, BAND).entry
    assert entry.image is not None  # decoded in the rollout
    alone = len(pickle.dumps(entry))
    assert alone < len(raw) + 200  # no pixels
    shared = pickle.dumps([{"images": [entry, entry]} for _ in range(50)])
    assert len(shared) < len(raw) + 50 * 60  # one copy of the page, 100 references
    back = pickle.loads(shared)
    assert back[0]["images"][0] is back[49]["images"][1]  # still one object on the other side
    assert back[0]["images"][0].key == entry.key and back[0]["images"][0]._image is None  # decoded only when read
    assert np.array_equal(np.asarray(back[0]["images"][0].image), np.asarray(entry.image))


def test_entries_are_immutable_and_copies_are_the_same_page():
    entry = PageEntry(encoded(cover_image(5)))
    with pytest.raises(TypeError, match="immutable"):
        entry["bytes"] = b"other"
    assert copy.deepcopy(entry) is entry
    assert copy.copy(entry).key == entry.key and copy.copy(entry) == entry
    with pytest.raises(ValueError, match="encoded image bytes"):
        PageEntry(b"")
    assert entry.size == cover_image(5).size  # from the header, nothing decoded
    assert entry._image is None


def test_any_served_content_has_a_key():
    assert content_key("QUJD") == content_key(b"QUJD")  # base64 text and its ASCII bytes: one page
    assert content_key("QUJD") != content_key("QUJE")
    assert len(content_key("not base64: é \udc80")) == 32  # malformed text is keyed, then fails to decode


def test_the_cache_decodes_a_page_once_and_lets_it_go_with_its_last_holder():
    cache, calls = PageCache(), []
    raw = encoded(cover_image(6).resize((196, 252)))

    def decode():
        calls.append(1)
        return decode_page(base64.b64encode(raw).decode(), BAND).entry

    first = cache.get("k", decode)
    assert cache.get("k", decode) is first and len(calls) == 1
    assert cache.get("other", lambda: None) is None and len(cache) == 1  # undecodable: not kept
    assert cache.get("same page, served otherwise", decode) is first and len(calls) == 2  # one page by content
    del first
    assert len(cache) == 0  # held weakly
    cache.get("k", decode)
    assert len(calls) == 3


def test_observer_gives_every_sample_fetching_a_page_the_same_entry_and_a_crop_its_own(tiny_processor):
    """The rollout's observer: the same page served to two samples (two calls, fresh objects,
    as the retriever answers them) is one PageImage and one entry; a crop of it is another."""
    from vrag_rollout.core.actions import Fetch
    from vrag_rollout.core.observation import ObservationBuilder, VisionTokens
    from vrag_rollout.retrieval.types import RetrievedPage
    from vrag_rollout.rollout.tools import Observer, Room

    page = cover_image(7).resize((196, 252))
    crop = page.crop((0, 0, 112, 140)).resize((196, 252))
    tokenizer = tiny_processor.tokenizer
    builder = ObservationBuilder(tokenizer, VisionTokens.from_tokenizer(tokenizer))
    observer = Observer(builder, BAND)

    def served(image, page_id, region=None):
        return RetrievedPage(page_id=page_id, doc_id="doc", page=2, modality="image",
                             contents=base64.b64encode(encoded(image)).decode(), region=region)

    first, second = observer.observe_turn([
        (Fetch("image", 2), served(page, "doc_2"), Room(10_000, 4)),
        (Fetch("image", 2), served(page, "doc_2"), Room(10_000, 4)),
    ])
    (cropped,) = observer.observe_turn([(Fetch("image", 2), served(crop, "doc_2", (0, 0, 0.5, 0.5)), Room(10_000, 4))])
    a, b, c = (result.observation.images[0] for result in (first, second, cropped))
    assert a.entry is b.entry and a.image is b.image
    assert c.entry.key != a.entry.key
    assert observer.pages.misses == 2  # the page and the crop

    # the trainer's band narrowed between rollout calls: the same answer is another page
    observer.band = PixelBand(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
    (narrowed,) = observer.observe_turn([(Fetch("image", 2), served(page, "doc_2"), Room(10_000, 4))])
    d = narrowed.observation.images[0]
    assert d.entry.key != a.entry.key and d.image.width * d.image.height <= 28 * 28 * 16


def test_easyr1_inputs_per_distinct_page_equal_the_processors_per_sample(tiny_processor):
    """Oracle: the image processor run on each sample's own image list, as EasyR1 ships it. Ours
    processes each distinct page once and concatenates on read: the same tensors, bit for bit."""
    pages = [fit_to_band(cover_image(10 + k).resize(size), BAND).entry
             for k, size in enumerate([(196, 252), (252, 196), (140, 308)])]
    prompt_image = cover_image(20).resize((112, 112))
    samples = [[prompt_image, pages[0], pages[1]], [prompt_image, pages[0], pages[1]],
               [prompt_image, pages[2], pages[0]], [pages[1]], []]
    column = np.empty(len(samples), dtype=object)
    column[:] = [{"images": images} for images in samples]
    column = pickle.loads(pickle.dumps(column))  # as a worker receives it

    calls = []

    class Counting:
        def __init__(self):
            self.image_processor = self

        def __call__(self, images=None, **kwargs):
            calls.append(len(images))
            return tiny_processor.image_processor(images=images, **kwargs)

    def process_image(image, min_pixels, max_pixels):  # EasyR1's reading: a dict's bytes through PIL
        if isinstance(image, dict):
            image = Image.open(io.BytesIO(image["bytes"]))
        image.load()
        return image.convert("RGB")

    keys = sample_cache_keys(column, ["u0", "u0", "u1", "u2", "u3"])
    got = build_multi_modal_inputs(column, keys, Counting(), process_image, None, None, None, 2.0)
    assert sum(calls) == 4  # the prompt image and three pages, each once
    for images, inputs in zip(column, got):
        if not images["images"]:
            assert inputs == {}
            continue
        assert isinstance(inputs, SharedImageInputs)
        want = tiny_processor.image_processor(images=[pixels(x) for x in images["images"]], return_tensors="pt")
        assert set(inputs) == set(want.keys())
        for name in want.keys():
            assert inputs[name].dtype == want[name].dtype
            assert np.array_equal(inputs[name].numpy(), want[name].numpy()), name


def test_shared_inputs_read_write_copy_and_pickle_as_a_dict():
    """The trainers treat a sample's inputs as a dict: every dict method sees the stacked keys,
    a copy is independent, and a pickle of many samples carries each shared part once."""
    parts = [{"pixel_values": torch.full((2, 3), float(k)), "image_grid_thw": torch.tensor([[1, 1, 2]])}
             for k in range(2)]
    inputs = SharedImageInputs(parts, {"images_seqlens": torch.tensor([2, 2])})
    assert list(inputs) == ["pixel_values", "image_grid_thw", "images_seqlens"] == list(dict(inputs))
    assert torch.equal(inputs["pixel_values"], torch.cat([parts[0]["pixel_values"], parts[1]["pixel_values"]]))
    assert set({**inputs}) == set(inputs) and inputs.get("video_grid_thw") is None
    assert np.array([inputs, inputs], dtype=object).shape == (2,)  # one object per sample, not a sequence
    copied = inputs.copy()
    copied.pop("pixel_values")
    assert "pixel_values" in inputs and "pixel_values" not in copied
    inputs.update(image_grid_thw=torch.zeros(1))
    assert torch.equal(inputs["image_grid_thw"], torch.zeros(1))
    many = pickle.loads(pickle.dumps([SharedImageInputs(parts) for _ in range(20)]))
    assert all(sample.parts[0] is many[0].parts[0] for sample in many)
    assert len(pickle.dumps([SharedImageInputs(parts) for _ in range(20)])) < 2 * len(pickle.dumps(parts))
