"""`vrag-rollout view` of region images ("look closer"): a crop beside the page it was cut from,
its box drawn over that page. A real rollout's batch is given crops the way a region action
records them: the crop's `image_regions` entry (fractions of the page) and the source page's id
in `page_ids`; the crop image is the source image cut to the box and zoomed.
"""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
from PIL import Image

from tests.verify.test_view import _chromium, needs_chromium
from tests.verify.test_view_first_screen import dom, text
from vrag_rollout.verify.saved_batch import load_rollout
from vrag_rollout.verify.view import data_uri, render

BOX = [0.62, 0.30, 0.68, 0.35]
OUTLINE = [0xE6, 0x00, 0x7E]  # the box's outline colour (view.py's .crop-box)


def _image_places(page: str, row: int) -> tuple[int, dict[int, tuple[int, int]]]:
    """(the row's prompt image count, {image number K: (observation, position in it)}), read from
    the page as rendered before any crop: observation o's images carry page_ids[row][o] in order."""
    section = dom(page).find_all("section", "episode")[row]
    number = lambda img: int(img.attrs["id"].rsplit("-", 1)[1])  # noqa: E731
    prompt = len(section.find_all("details", "prompt")[0].find_all("img", "thumb"))
    places = {number(img): (o, p) for o, obs in enumerate(section.find_all("span", "obs"))
              for p, img in enumerate(obs.find_all("img", "thumb"))}
    return prompt, places


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def cropped(grammar_rollout):
    """(batch with crops, the same batch without the column, row, crop K, source K, lone row, lone K).
    Row 0 (the first on the page): its last retrieved image is a crop of `sheet_2`, shown whole
    twice before it (the source is the later one). Row `lone`: its first retrieved image crops a
    page it never saw."""
    saved = load_rollout(grammar_rollout.path)
    del saved.columns["image_regions"]
    before = render(saved)
    row, lone = 0, next(r for r in range(1, len(saved)) if _image_places(before, r)[1])
    prompt, places = _image_places(before, row)
    retrieved = sorted(places)
    assert len(retrieved) >= 3, "the rollout's first episode shows at least 3 pages"
    earlier, source, crop = retrieved[0], retrieved[-2], retrieved[-1]
    for k in (earlier, source, crop):  # the same page, shown whole twice, then cropped
        o, p = places[k]
        saved.columns["page_ids"][row][o][p] = "sheet_2"
    saved.images[row][earlier] = _png(Image.new("RGB", (60, 80), "white"))  # tells the two views apart
    page = Image.open(io.BytesIO(saved.images[row][source])).convert("RGB")
    w, h = page.size
    saved.images[row][crop] = _png(page.crop((round(BOX[0] * w), round(BOX[1] * h), round(BOX[2] * w),
                                              round(BOX[3] * h))).resize((120, 100)))
    regions = [[None] * (len(images) - _image_places(before, r)[0]) for r, images in enumerate(saved.images)]
    regions[row][crop - prompt] = BOX

    lone_prompt, lone_places = _image_places(before, lone)
    lone_k = min(lone_places)
    o, p = lone_places[lone_k]
    saved.columns["page_ids"][lone][o][p] = "<b>elsewhere</b>_9"
    regions[lone][lone_k - lone_prompt] = [0.1, 0.2, 0.5, 0.6]
    without = copy.deepcopy(saved)
    saved.columns["image_regions"] = regions
    return saved, without, row, crop, source, lone, lone_k


def test_a_crop_sits_beside_its_source_page_with_the_box_drawn(cropped):
    saved, _, row, crop, source, _, _ = cropped
    section = dom(render(saved)).find_all("section", "episode")[row]
    figures = section.find_all("figure", "crop")
    assert len(figures) == 1
    images = figures[0].find_all("img")
    assert [sorted(img.classes) for img in images] == [["thumb"], ["crop-source"]]
    assert images[0].attrs["id"] == f"img-{row}-{crop}" and images[0].attrs["src"] == data_uri(saved.images[row][crop])
    assert "id" not in images[1].attrs  # the copy takes no image number
    assert images[1].attrs["src"] == data_uri(saved.images[row][source])  # the latest whole view of sheet_2
    box = figures[0].find_all("span", "crop-box")
    assert len(box) == 1 and box[0].parent.find_all("img") == [images[1]]  # drawn over the source page
    assert box[0].attrs["style"] == "left:62.0%;top:30.0%;width:6.0%;height:5.0%"
    caption = "region of sheet_2 [0.62, 0.3, 0.68, 0.35]"
    assert caption in text(figures[0].find_all("figcaption")[0])
    assert caption in images[0].attrs["alt"] and caption in images[0].attrs["title"]


def test_a_crop_of_a_page_the_episode_never_saw_is_shown_alone(cropped):
    saved, _, _, _, _, lone, lone_k = cropped
    page = render(saved)
    figure = dom(page).find_all("section", "episode")[lone].find_all("figure", "crop")
    assert len(figure) == 1
    assert [img.attrs["id"] for img in figure[0].find_all("img")] == [f"img-{lone}-{lone_k}"]
    assert "source page not in this episode" in text(figure[0]) and not figure[0].find_all("span", "crop-box")
    assert "region of &lt;b&gt;elsewhere&lt;/b&gt;_9 [0.1, 0.2, 0.5, 0.6]" in page and "<b>elsewhere" not in page


def test_crops_keep_the_image_numbering(cropped):
    saved, without, _, _, _, _, _ = cropped
    numbered = lambda page: [(img.attrs["id"], img.attrs["src"]) for img in dom(page).find_all("img")  # noqa: E731
                             if img.attrs.get("id", "").startswith("img-")]
    assert numbered(render(saved)) == numbered(render(without))
    assert len(numbered(render(saved))) == sum(len(images) for images in saved.images)


def test_a_batch_without_crops_renders_as_before(cropped):
    """No `image_regions` column (an older batch), or one of whole pages only: the same page,
    byte for byte, with no crop markup or style."""
    _, without, _, _, _, _, _ = cropped
    page = render(without)
    assert 'class="crop' not in page and ".crop-box" not in page
    whole = copy.deepcopy(without)
    whole.columns["image_regions"] = [[None] * len(images) for images in whole.images]
    assert render(whole) == page


@needs_chromium
def test_the_box_is_drawn_in_headless_chromium(cropped, tmp_path):
    saved, without, _, _, _, _, _ = cropped
    counts = []
    for name, batch in (("crops", saved), ("without", without)):
        html_file = tmp_path / f"{name}.html"
        html_file.write_text(render(batch))
        shot = tmp_path / f"{name}.png"  # tall enough to hold the first episode's conversation
        _chromium("--window-size=1280,3000", f"--screenshot={shot}", html_file.resolve().as_uri(), tmp_path=tmp_path)
        pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
        counts.append(int(np.all(np.abs(pixels - OUTLINE) < 40, axis=-1).sum()))
    assert counts[0] > 20 and counts[1] == 0, counts  # the outline, and nothing else of its colour
