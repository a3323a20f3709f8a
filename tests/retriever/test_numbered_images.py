"""Image folders whose file names number their images (issue 32, defect 6).

SlideVQA's download saves each slide as `<deck>-<slide>-<width>.jpg` and skips slides that fail
with 404. The index keeps numbering pages by position (what the wire's page ids say), and records
each image's own number beside it, so that a missing slide is visible instead of silently
shifting every later slide onto the number before it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from retriever_server.indexing.indexer import build_index
from retriever_server.indexing.ingest import discover, image_numbers
from retriever_server.storage.manifest import MANIFEST_NAME, missing_numbers, read_manifest

DECK = "tokyo-olympics-2020-deck"  # a deck name holding digits of its own, as SlideVQA's do


def write_deck(folder: Path, slides, name="{deck}-{k}-1024.jpg") -> Path:
    """A deck folder holding `slides` (slide numbers, or names), each a small image of its own colour."""
    folder.mkdir(parents=True)
    for n, k in enumerate(slides, start=1):
        Image.new("RGB", (96, 72), (40 * n, 200 - 9 * n, 30 + 11 * n)).save(
            folder / name.format(deck=folder.name, k=k))
    return folder


@pytest.mark.parametrize("names, numbers", [
    ([f"{DECK}-{k}-1024.jpg" for k in (1, 2, 4, 10)], (1, 2, 4, 10)),  # SlideVQA's names
    (["slide_1_1024.jpg", "slide_2_1024.jpg", "slide_12_1024.jpg"], (1, 2, 12)),
    (["p1.png", "P2.JPG", "p10.png"], (1, 2, 10)),      # case and suffix aside
    (["page_007.png"], (7,)),                           # a lone image with one number
    (["cover.png", "p1.png"], None),                    # names of different shapes
    (["a.png", "b.png"], None),                         # no numbers
    (["s1_v1.png", "s2_v2.png"], None),                 # two numbers vary: no guess
    (["p1.png", "p01.jpg"], None),                      # the same number twice
    ([f"{DECK}-3-1024.jpg"], None),                     # a lone image with several numbers
])
def test_an_images_own_number_is_read_from_its_name_only_when_unambiguous(names, numbers):
    assert image_numbers([Path(n) for n in names]) == numbers


def test_a_deck_missing_a_slide_keeps_positions_and_records_each_slides_number(tmp_path, capsys):
    deck = write_deck(tmp_path / "images" / "test" / DECK, [1, 2, 4, 5])
    (doc,) = discover([deck])
    assert doc.numbers == (1, 2, 4, 5)
    index = build_index([deck], tmp_path / "idx", progress=False, ocr="off")
    manifest = read_manifest(index)
    assert [p.page for p in manifest.pages] == [1, 2, 3, 4]  # the wire's pages: positions, as before
    assert manifest.source_numbers() == {DECK: [1, 2, 4, 5]}
    notice = capsys.readouterr().err
    assert f"notice: {DECK!r}: no image numbered 3;" in notice and "pages 1..4" in notice


def test_pdfs_and_unnumbered_folders_record_nothing_and_their_manifests_are_unchanged(sample_pdfs, tmp_path):
    plain = write_deck(tmp_path / "scans", ["cover", "back"], name="{k}.png")
    index = build_index([sample_pdfs[0], plain], tmp_path / "idx", progress=False, ocr="off")
    assert read_manifest(index).source_numbers() == {}
    raw = json.loads((index / MANIFEST_NAME).read_text())
    assert not any("source_number" in page for page in raw["pages"])


def test_a_hand_edited_manifest_with_numbers_out_of_order_is_refused(tmp_path):
    index = build_index([write_deck(tmp_path / DECK, [1, 2, 3])], tmp_path / "idx", progress=False, ocr="off")
    raw = json.loads((index / MANIFEST_NAME).read_text())
    raw["pages"][1]["source_number"] = 7
    (index / MANIFEST_NAME).write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="source numbers of .* are not increasing"):
        read_manifest(index)


@pytest.mark.parametrize("numbers, missing", [
    ([1, 2, 4, 5], [3]),
    ([3, 4, 5], [1, 2]),              # the first slides lost: counted from 1
    ([4021, 4022, 4024], [4023]),     # camera numbers: only gaps between them
    ([1, 2, 3], []),
])
def test_missing_numbers(numbers, missing):
    assert missing_numbers(numbers) == missing
