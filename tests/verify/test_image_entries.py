"""Every kind of image entry a trainer batch holds, through every reader of the project: the
rollout's (`core.prompt_images.to_pil`), the guard's and `check`'s (`verify.image_entries`, the
saved batch's encoding, which `view` reads back), verl's prompt reader and EasyR1's per-image
cache key. Each reader gives the same pixels for every kind (the PNG's own pixels are the oracle)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vrag_rollout.core.pages import PageEntry
from vrag_rollout.core.prompt_images import to_pil
from vrag_rollout.integrations.easyr1.images import image_fingerprint
from vrag_rollout.integrations.verl.images import prompt_image
from vrag_rollout.verify.guard import _images
from vrag_rollout.verify.image_entries import entry_bytes, entry_image
from vrag_rollout.verify.saved_batch import encode_image

KINDS = ["pil", "page_entry", "bytes", "bytearray", "memoryview", "dict_bytes", "dict_path", "str_path",
         "pathlike", "array"]


@pytest.fixture(scope="module")
def picture(tmp_path_factory):
    image = Image.new("RGB", (37, 23), (10, 20, 30))
    image.putpixel((5, 7), (250, 1, 2))
    path = tmp_path_factory.mktemp("entries") / "page.png"
    image.save(path)
    return image, path


def entry_of(kind: str, image: Image.Image, path: Path):
    data = path.read_bytes()
    return {"pil": image, "page_entry": PageEntry(data), "bytes": data, "bytearray": bytearray(data),
            "memoryview": memoryview(data), "dict_bytes": {"bytes": data, "path": None},
            "dict_path": {"bytes": None, "path": str(path)}, "str_path": str(path), "pathlike": path,
            "array": np.asarray(image)}[kind]


def same_pixels(a: Image.Image, b: Image.Image) -> bool:
    return a.size == b.size and np.array_equal(np.asarray(a.convert("RGB")), np.asarray(b.convert("RGB")))


@pytest.mark.parametrize("kind", KINDS)
def test_every_reader_reads_every_kind(kind, picture):
    image, path = picture
    entry = entry_of(kind, image, path)
    assert same_pixels(to_pil(entry), image)  # the rollout
    assert same_pixels(entry_image(entry), image)  # the guard
    with Image.open(io.BytesIO(encode_image(entry))) as saved:  # check and view (the saved batch)
        assert same_pixels(saved, image)
    assert entry_bytes(entry) == encode_image(entry)
    assert same_pixels(prompt_image({"type": "image", "image": entry}), image)  # verl's prompt reader
    assert not image_fingerprint(entry).startswith("opaque:")  # EasyR1's cache keys it by content or path
    batch = type("Batch", (), {"non_tensor_batch": {"multi_modal_data": np.array([{"images": [entry]}], dtype=object)},
                               "batch": {}})()
    (row,) = _images(batch)
    assert same_pixels(row[0], image)


def test_an_entry_of_no_known_kind_is_refused_by_name():
    for read in (to_pil, entry_image, encode_image):
        with pytest.raises(TypeError, match="int"):
            read(42)
    with pytest.raises(TypeError, match="neither 'bytes' nor 'path'"):
        entry_image({"bytes": None, "path": None})
