"""POST /batch_crop and RetrieverClient.batch_crop: a region of a page, drawn from its source.

Marks are drawn with reportlab at known positions; every expectation about where a mark lands,
and how sharp it is, is measured on the answer's pixels with numpy, from the drawing's own
numbers, never from the server's arithmetic.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image, ImageDraw
from reportlab.pdfgen import canvas

from retriever_server import contract
from retriever_server.api.app import create_app
from retriever_server.api.testing import serve_in_thread
from retriever_server.indexing.indexer import build_index
from retriever_server.serving.limits import Limits
from retriever_server.storage.manifest import MANIFEST_NAME
from vrag_rollout.retrieval.client import RetrieverClient
from vrag_rollout.retrieval.fixtures import FixtureMiss, FixtureTransport, Fixtures, record_fixtures
from vrag_rollout.retrieval.types import RetrievedPage, RetrieverFailure

# Live servers, and an index of scanned pages that tesseract (a subprocess) reads where installed.
pytestmark = pytest.mark.process

PAGE_W, PAGE_H = 612.0, 792.0  # US letter, points
MARK = 24.0  # side of the square mark, points
# Centre of the mark per page of marks.pdf, in points from the top left.
MARKS = {1: (400.0, 300.0), 2: (150.0, 600.0)}
IMAGE_W, IMAGE_H, IMAGE_MARK = 800, 1000, 40  # scans/: page images, mark centred at (200, 700)
IMAGE_CENTRE = (200, 700)
BAND = {"min_pixels": 512 * 28 * 28, "max_pixels": 1280 * 28 * 28}


def _mark_pdf(path: Path) -> Path:
    c = canvas.Canvas(str(path), pagesize=(PAGE_W, PAGE_H), invariant=1)
    for page in (1, 2):
        cx, cy = MARKS[page]
        c.setFont("Helvetica", 9)
        c.drawString(72, 72, f"Inspection sheet page {page}: torque values in the appendix")
        c.rect(cx - MARK / 2, PAGE_H - cy - MARK / 2, MARK, MARK, stroke=0, fill=1)
        c.showPage()
    c.save()
    return path


def _ticket_pdf(path: Path) -> Path:
    """A small page (200 x 200 pt): a box of 3 % of its side covers only 6 points."""
    c = canvas.Canvas(str(path), pagesize=(200, 200), invariant=1)
    c.drawString(20, 100, "Admit one")
    c.showPage()
    c.save()
    return path


def _scans(folder: Path) -> Path:
    folder.mkdir()
    for page in (1, 2):
        image = Image.new("RGB", (IMAGE_W, IMAGE_H), "white")
        x, y = IMAGE_CENTRE
        ImageDraw.Draw(image).rectangle([x - IMAGE_MARK // 2, y - IMAGE_MARK // 2,
                                         x + IMAGE_MARK // 2 - 1, y + IMAGE_MARK // 2 - 1], fill="black")
        image.save(folder / f"p{page}.png")
    return folder


@pytest.fixture(scope="module")
def crop_index(sample_pdfs, tmp_path_factory):
    src = tmp_path_factory.mktemp("crop_src")
    sources = [*sample_pdfs, _mark_pdf(src / "marks.pdf"), _ticket_pdf(src / "ticket.pdf"),
               _scans(src / "scans")]
    return build_index(sources, tmp_path_factory.mktemp("crop_index") / "idx", progress=False)


@pytest.fixture(scope="module")
def legacy_index(crop_index, tmp_path_factory):
    """The same index as an older build wrote it: no PDF copies, no ``pdf`` in the manifest."""
    old = tmp_path_factory.mktemp("legacy") / "idx"
    shutil.copytree(crop_index, old)
    shutil.rmtree(old / "sources")
    manifest = json.loads((old / MANIFEST_NAME).read_text())
    for doc in manifest["docs"]:
        doc.pop("pdf", None)
    (old / MANIFEST_NAME).write_text(json.dumps(manifest))
    return old


@pytest.fixture(scope="module")
def http(crop_index):
    with TestClient(create_app(crop_index)) as c:
        yield c


def crop(http, ids, pages, boxes, **band):
    r = http.post("/batch_crop", json={"id": ids, "page": pages, "box": boxes, **(band or BAND)})
    assert r.status_code == 200, r.text
    return r.json()


def image_of(item) -> Image.Image:
    image = Image.open(io.BytesIO(base64.b64decode(item["contents"], validate=True)))
    image.load()
    assert image.format == "JPEG"
    return image


def dark(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("L")) < 128


def centroid(image: Image.Image) -> tuple[float, float]:
    """Centre of the dark pixels, as fractions of the image's width and height."""
    ys, xs = np.nonzero(dark(image))
    assert len(xs), "no mark in the image"
    return (xs.mean() + 0.5) / image.width, (ys.mean() + 0.5) / image.height


def mark_width(image: Image.Image) -> int:
    xs = np.nonzero(dark(image).any(axis=0))[0]
    return int(xs.max() - xs.min() + 1)


def gray_share(image: Image.Image) -> float:
    """Share of the mark's neighbourhood that is neither paper nor ink: the blur of its edges."""
    a = np.asarray(image.convert("L"))
    return float(((a > 40) & (a < 215)).sum()) / max(1, int((a <= 40).sum()))


def in_band(item, factor=28, band=BAND):
    w, h = item["width"], item["height"]
    assert image_of(item).size == (w, h)
    assert w % factor == 0 and h % factor == 0
    assert band["min_pixels"] <= w * h <= band["max_pixels"]


@pytest.fixture(scope="module")
def seen(http):
    """Centre of each page's mark in the page image the model sees (boxes are fractions of it),
    measured on the fetched JPEG; and that it is where the PDF put it, to within the trim of the
    28-grid (a point or two)."""
    fetched = http.post("/batch_fetch", json={"query": ["image, 1", "image, 2"], "id": "marks"}).json()
    centres = {}
    for page, item in zip((1, 2), fetched):
        image = image_of(item)
        top = image.crop((0, 0, image.width, int(0.85 * image.height)))  # the text line is below
        x, y = centroid(top)
        centres[page] = x, y * top.height / image.height
    for page, (x, y) in centres.items():
        assert x == pytest.approx(MARKS[page][0] / PAGE_W, abs=0.01)
        assert y == pytest.approx(MARKS[page][1] / PAGE_H, abs=0.01)
    return centres


def box_at(centre, left=0.5, top=0.5, w=0.2, h=0.12) -> list[float]:
    """A box of w x h (fractions of the page) holding ``centre`` at (left, top) of the box."""
    cx, cy = centre
    return [cx - left * w, cy - top * h, cx + (1 - left) * w, cy + (1 - top) * h]


# --------------------------------------------------------------------------- where and how sharp


@pytest.mark.parametrize("page, left, top", [(1, 0.5, 0.5), (2, 0.5, 0.5), (1, 0.25, 0.5), (1, 0.5, 0.2),
                                             (2, 0.8, 0.7)])
def test_the_mark_lands_where_the_box_puts_it(http, seen, page, left, top):
    (item,) = crop(http, ["marks"], [page], [box_at(seen[page], left, top)])
    assert item["id"] == f"marks_{page}" and item["source"] == "pdf" and item["page"] == page
    x, y = centroid(image_of(item))
    assert x == pytest.approx(left, abs=0.01) and y == pytest.approx(top, abs=0.01)
    in_band(item)


def test_a_crop_is_drawn_sharper_than_the_stored_page(http, seen, legacy_index):
    box = box_at(seen[1])
    (item,) = crop(http, ["marks"], [1], [box])
    fetched = http.post("/batch_fetch", json={"query": ["image, 1"], "id": ["marks"]}).json()[0]
    page = image_of(fetched)
    region = page.crop((round(box[0] * page.width), round(box[1] * page.height),
                        round(box[2] * page.width), round(box[3] * page.height)))
    assert mark_width(image_of(item)) >= 4 * mark_width(region)  # many more pixels across the mark
    # The same crop cut from the stored image (an index without PDF copies) is upscaled, not
    # drawn: its mark's edges are ramps of gray several pixels wide, against one pixel.
    with TestClient(create_app(legacy_index)) as old:
        (upscaled,) = crop(old, ["marks"], [1], [box])
    assert upscaled["source"] == "page_image"
    in_band(upscaled)
    assert gray_share(image_of(item)) * 2 < gray_share(image_of(upscaled))


def test_text_of_the_sample_corpus_is_drawn_at_the_crops_resolution(http):
    # The heading of safety_manual page 2 ("2. Lockout/Tagout Procedure").
    box = [0.05, 0.05, 0.55, 0.2]
    (item,) = crop(http, ["safety_manual"], [2], [box])
    fetched = http.post("/batch_fetch", json={"query": ["image, 2"], "id": ["safety_manual"]}).json()[0]
    stored = image_of(fetched)
    assert item["width"] >= 3 * (box[2] - box[0]) * stored.width
    assert dark(image_of(item)).any()


@pytest.mark.parametrize("band, factor", [
    ({"min_pixels": 784, "max_pixels": 200_704}, 28),
    ({"min_pixels": 512 * 28 * 28, "max_pixels": 1280 * 28 * 28}, 28),
    ({"min_pixels": 1024 * 32 * 32, "max_pixels": 2048 * 32 * 32}, 32),
])
def test_every_crop_lands_inside_the_requested_band(http, seen, band, factor):
    boxes = [[0, 0, 1, 1], box_at(seen[1]), [0.1, 0.4, 0.9, 0.45], [0.3, 0.1, 0.35, 0.9]]
    items = crop(http, ["marks", "marks", "safety_manual", "scans"], [1, 1, 3, 2], boxes,
                 **band, factor=factor)
    for item in items:
        in_band(item, factor, band)


def test_a_page_image_document_is_cut_from_its_stored_image(http):
    cx, cy = IMAGE_CENTRE[0] / IMAGE_W, IMAGE_CENTRE[1] / IMAGE_H
    box = [cx - 0.05, cy - 0.1, cx + 0.15, cy + 0.1]  # the mark at 25 % across, 50 % down
    (item,) = crop(http, ["scans"], [1], [box])
    assert item["source"] == "page_image"
    x, y = centroid(image_of(item))
    assert x == pytest.approx(0.25, abs=0.015) and y == pytest.approx(0.5, abs=0.015)
    in_band(item)


def test_msgpack_answers_carry_the_jpeg_bytes(http, seen):
    import msgspec

    r = http.post("/batch_crop", headers={"accept": contract.MSGPACK},
                  json={"id": "marks", "page": [1], "box": [box_at(seen[1])], **BAND})
    (item,) = msgspec.msgpack.decode(r.content)
    assert r.headers["content-type"] == contract.MSGPACK
    assert isinstance(item["contents"], bytes) and item["contents"][:2] == b"\xff\xd8"


# --------------------------------------------------------------------------- errors


BAD_BOXES = {
    "outside": [-0.1, 0.2, 0.5, 0.6],
    "past the edge": [0.2, 0.2, 1.2, 0.6],
    "empty": [0.3, 0.2, 0.3, 0.6],
    "inverted": [0.5, 0.6, 0.2, 0.2],
    "three numbers": [0.1, 0.2, 0.5],
    "five numbers": [0.1, 0.2, 0.5, 0.6, 0.7],
    "text": "top half",
    "null": None,
    "booleans": [True, False, True, True],
    "strings": ["0.1", "0.2", "0.5", "0.6"],
    "nested": [[0.1, 0.2], [0.5, 0.6]],
    "too small": [0.1, 0.1, 0.105, 0.5],
}


def test_every_bad_box_gets_its_own_error_and_good_crops_in_the_batch_succeed(http, seen):
    good = box_at(seen[1])
    boxes, names = [good], ["good"]
    for name, box in BAD_BOXES.items():
        boxes += [box, good]
        names += [name, "good"]
    items = crop(http, ["marks"] * len(boxes), [1] * len(boxes), boxes)
    for name, item in zip(names, items):
        if name == "good":
            assert item["id"] == "marks_1" and centroid(image_of(item)) == pytest.approx((0.5, 0.5), abs=0.01)
        else:
            assert item["id"] == contract.ERROR_ID and item["code"] == contract.BAD_BOX, name
            assert item["contents"] == contract.box_problem(BAD_BOXES[name]), name


def test_non_finite_numbers_are_bad_boxes(http):
    # Python's JSON reader takes NaN, Infinity and 1e999 (inf); strict JSON cannot carry them.
    body = (b'{"id": "marks", "page": [1, 1, 1, 1], "box": [[NaN, 0.1, 0.5, 0.5], '
            b'[0.1, 0.1, Infinity, 0.5], [0.1, 0.1, 0.5, 1e999], [0.1, 0.1, 0.5, 0.5]]}')
    r = http.post("/batch_crop", content=body, headers={"content-type": "application/json"})
    items = r.json()
    assert [i.get("code") for i in items[:3]] == [contract.BAD_BOX] * 3
    assert all("not a finite number" in i["contents"] for i in items[:3])
    assert items[3]["id"] == "marks_1"


def test_a_box_too_small_at_its_source_is_refused_with_its_size(http):
    # 3 % of a 200-point page is 6 points: over the fraction floor, under the source floor.
    items = crop(http, ["ticket", "ticket"], [1, 1], [[0.1, 0.1, 0.13, 0.5], [0.1, 0.1, 0.6, 0.6]])
    assert items[0]["code"] == contract.BAD_BOX and "6.0 x 80.0 points" in items[0]["contents"]
    assert items[1]["id"] == "ticket_1"
    in_band(items[1])


def test_unknown_documents_and_pages_out_of_range(http):
    items = crop(http, ["nope", "marks", "marks", "marks"], [1, 3, 0, 2], [[0, 0, 1, 1]] * 4)
    assert [i.get("code") for i in items[:3]] == [contract.UNKNOWN_DOCUMENT, contract.PAGE_OUT_OF_RANGE,
                                                 contract.PAGE_OUT_OF_RANGE]
    assert "pages 1..2" in items[1]["contents"]
    assert items[3]["id"] == "marks_2"


@pytest.mark.parametrize("body, words", [
    ({"id": "marks", "page": [1], "box": [[0, 0, 1, 1]], "min_pixels": 5000, "max_pixels": 4000}, "min_pixels"),
    ({"id": "marks", "page": [1], "box": [[0, 0, 1, 1]], "factor": 3}, "factor"),
    ({"id": "marks", "page": [1], "box": [[0, 0, 1, 1]], "max_pixels": 10**9}, "limit"),
    ({"id": ["marks", "marks"], "page": [1], "box": [[0, 0, 1, 1]]}, "'id'"),
    ({"id": "marks", "page": [1, 2], "box": [[0, 0, 1, 1]]}, "'box'"),
    ({"id": "marks", "page": [1] * 65, "box": [[0, 0, 1, 1]] * 65}, "split it"),
    ({"id": "marks", "page": [1], "box": "top half"}, "box"),
    ({"id": "marks", "page": ["first"], "box": [[0, 0, 1, 1]]}, "page"),
    ({"id": "marks", "box": [[0, 0, 1, 1]]}, "page"),
])
def test_malformed_requests_are_422(http, body, words):
    r = http.post("/batch_crop", json=body)
    assert r.status_code == 422 and words in r.json()["detail"]


def test_an_answer_over_the_size_limit_is_refused_whole(crop_index):
    with TestClient(create_app(crop_index, limits=Limits(max_answer_bytes=50_000))) as small:
        r = small.post("/batch_crop", json={"id": "marks", "page": [1, 2], "box": [[0, 0, 1, 1]] * 2, **BAND})
    assert r.status_code == 413 and "Crop fewer regions" in r.json()["detail"]


# --- the cost of a request, bounded before anything is drawn (issue 32, defect 7)


@pytest.fixture
def draws(monkeypatch):
    """Every crop drawn: `Cropper.crop` counts, then draws as usual (`draws.fake = True`: fails
    each crop instead, so a test of a refusal stays fast on a server that would draw)."""
    from retriever_server.serving import cropping

    real, calls = cropping.Cropper.crop, []

    def counted(self, doc_id, page, box, band):
        calls.append((doc_id, page))
        if counted.fake:
            raise RuntimeError("drawn")
        return real(self, doc_id, page, box, band)

    counted.fake = False
    monkeypatch.setattr(cropping.Cropper, "crop", counted)
    return counted, calls


LARGE = 16384 * 28 * 28  # the largest band a server accepts (Limits.max_crop_pixels)


@pytest.mark.parametrize("limits, crops, band, status, words", [
    # the answer could pass the size limit: refused by its worst case, not after drawing
    ({"max_answer_bytes": 50_000}, 2, BAND, 413, "could hold 2 crops of up to 1,003,520 pixels"),
    # too much drawing for one request: the 64 crops at the largest band, and just over the limit
    ({}, 64, {"min_pixels": 784, "max_pixels": LARGE}, 422, "Send at most 5 crops per request"),
    ({}, 6, {"min_pixels": 784, "max_pixels": LARGE}, 422, "the limit is 64,225,280 pixels per request"),
    ({"max_crop_request_pixels": LARGE}, 2, {"min_pixels": 784, "max_pixels": LARGE}, 422, "at most 1 crops"),
])
def test_a_request_that_could_cost_too_much_is_refused_before_anything_is_drawn(crop_index, draws, limits,
                                                                                 crops, band, status, words):
    counted, calls = draws
    counted.fake = True
    with TestClient(create_app(crop_index, limits=Limits(**limits))) as http:
        r = http.post("/batch_crop", json={"id": "marks", "page": [1] * crops, "box": [[0, 0, 1, 1]] * crops, **band})
    assert (r.status_code, calls) == (status, [])
    assert words in r.json()["detail"]


def test_items_answered_with_an_error_are_not_counted_and_a_normal_request_is_drawn(crop_index, draws):
    _, calls = draws
    # room for exactly the two crops that can be drawn
    limits = Limits(max_crop_pixels=BAND["max_pixels"], max_crop_request_pixels=2 * BAND["max_pixels"])
    with TestClient(create_app(crop_index, limits=limits)) as http:
        items = crop(http, ["marks", "marks", "nowhere", "marks"], [1, 2, 1, 9], [[0, 0, 1, 1]] * 4, **BAND)
    assert [i.get("code") for i in items] == [None, None, contract.UNKNOWN_DOCUMENT, contract.PAGE_OUT_OF_RANGE]
    assert calls == [("marks", 1), ("marks", 2)]
    for item in items[:2]:
        in_band(item)


def test_the_rollouts_default_chunk_fits_in_messagepack_and_json_is_told_how_many_fit(crop_index):
    """64 crops at the default band (the client's chunk) fit the default limits as MessagePack, the
    rollout client's format; as JSON their worst case is over 64 MiB, and the refusal says what fits."""
    from retriever_server.serving.regions import Band
    from retriever_server.serving.service import RequestError

    service = create_app(crop_index).state.index.current.service
    band = Band(BAND["min_pixels"], BAND["max_pixels"], 28)
    service.check_crop_cost(contract.MAX_CROP_BATCH, band, contract.MSGPACK)
    assert contract.crops_per_request(BAND["max_pixels"]) == contract.MAX_CROP_BATCH
    assert contract.crops_per_request(LARGE) == 5
    with pytest.raises(RequestError):
        service.check_crop_cost(contract.MAX_CROP_BATCH, Band(784, LARGE, 28), contract.MSGPACK)
    from retriever_server.serving.answer_size import AnswerTooLarge

    with pytest.raises(AnswerTooLarge, match=r"up to 81.8 MiB as JSON.*at most about 50\).*MessagePack answers"):
        service.check_crop_cost(contract.MAX_CROP_BATCH, band, contract.JSON)


def test_an_index_without_pdf_copies_loads_and_crops_from_its_page_images(legacy_index, seen):
    with TestClient(create_app(legacy_index)) as old:
        items = crop(old, ["marks", "safety_manual", "scans"], [2, 1, 1],
                     [box_at(seen[2]), [0, 0, 1, 0.5], [0.1, 0.1, 0.9, 0.9]])
    assert [i["source"] for i in items] == ["page_image"] * 3
    x, y = centroid(image_of(items[0]))
    assert x == pytest.approx(0.5, abs=0.02) and y == pytest.approx(0.5, abs=0.02)
    for item in items:
        in_band(item)


# --------------------------------------------------------------------------- the client


def decoded(page: RetrievedPage) -> Image.Image:
    raw = page.contents if isinstance(page.contents, bytes) else base64.b64decode(page.contents)
    return Image.open(io.BytesIO(raw))


def test_client_crops_through_a_live_server(crop_index, seen):
    boxes = [box_at(seen[1]), [0.5, 0.5, 0.4, 0.6], box_at(seen[2], 0.25), [0, 0, 1, 1], [0, 0, 1, 1]]
    with serve_in_thread(crop_index) as url, RetrieverClient(url, timeout=30) as client:
        got = client.batch_crop(["marks", "marks", "marks", "nope", "marks"], [1, 1, 2, 1, 5], boxes,
                                BAND["min_pixels"], BAND["max_pixels"])
        sent = client.stats.items
        assert client.batch_crop([], [], [], 784, 784 * 4) == []
    assert isinstance(got[0], RetrievedPage)
    assert (got[0].page_id, got[0].doc_id, got[0].page, got[0].modality) == ("marks_1", "marks", 1, "image")
    assert isinstance(got[0].contents, bytes)  # a MessagePack answer: the JPEG itself
    assert centroid(decoded(got[0])) == pytest.approx((0.5, 0.5), abs=0.01)
    assert got[1] == RetrieverFailure("request", contract.box_problem(boxes[1]))  # never sent
    assert sent == 4
    assert centroid(decoded(got[2])) == pytest.approx((0.25, 0.5), abs=0.01)
    assert got[3].kind == "request" and "unknown document" in got[3].message
    assert got[4].kind == "request" and "out of range" in got[4].message


def test_client_chunks_crops_and_checks_its_arguments(crop_index):
    with serve_in_thread(crop_index) as url, RetrieverClient(url, timeout=30, max_batch=256) as client:
        got = client.batch_crop(["ticket"] * 70, [1] * 70, [[0, 0, 1, 1]] * 70, 784, 28 * 28 * 16)
        assert all(isinstance(g, RetrievedPage) for g in got)
        assert client.stats.calls == 2  # at most contract.MAX_CROP_BATCH a request
        for args in [(["marks"], [1, 2], [[0, 0, 1, 1]]), (["marks"], [1], []), (["marks"], [0], [[0, 0, 1, 1]]),
                     ([3], [1], [[0, 0, 1, 1]])]:
            with pytest.raises(ValueError):
                client.batch_crop(*args, 784, 784 * 4)
        with pytest.raises(ValueError):
            client.batch_crop(["marks"], [1], [[0, 0, 1, 1]], 784 * 4, 784)


def test_crops_record_and_replay_through_fixtures(crop_index, seen, tmp_path):
    crops = [("marks", 1, box_at(seen[1])), ("marks", 2, box_at(seen[2])), ("scans", 1, [0, 0, 0.5, 0.5]),
             ("marks", 9, [0, 0, 1, 1])]
    path = tmp_path / "crops.json"
    with serve_in_thread(crop_index) as url:
        summary = record_fixtures(url, path, searches=[], fetches=[], top_n=1, crops=crops,
                                  crop_band=(BAND["min_pixels"], BAND["max_pixels"]))
        with RetrieverClient(url, timeout=30, binary=False) as live_client:
            live = live_client.batch_crop([c[0] for c in crops], [c[1] for c in crops], [c[2] for c in crops],
                                          BAND["min_pixels"], BAND["max_pixels"])
    assert summary["crops"] == 4 and summary["server_errors"] == 1
    assert "crop" in json.loads(path.read_text())
    fx = FixtureTransport.load(path)
    order = [3, 1, 0, 2]
    with RetrieverClient(None, transport=fx, max_batch=2) as replay:
        got = replay.batch_crop([crops[i][0] for i in order], [crops[i][1] for i in order],
                                [[int(v) if v in (0, 1) else v for v in crops[i][2]] for i in order],
                                BAND["min_pixels"], BAND["max_pixels"])
        assert got == [live[i] for i in order]
        assert fx.requests["/batch_crop"] == 2
        with pytest.raises(FixtureMiss, match="crop"):
            replay.batch_crop(["marks"], [1], [[0.1, 0.1, 0.9, 0.9]], BAND["min_pixels"], BAND["max_pixels"])
    again = Fixtures.from_json(path.read_text()).to_json()
    assert again == path.read_text()


def test_fixture_files_without_crops_are_written_as_before():
    fx = Fixtures()
    fx.add_fetch("d", "text, 1", {"id": "text, 1", "contents": "hello"})
    assert "crop" not in json.loads(fx.to_json())


def test_a_rotated_page_is_stored_and_cropped_as_displayed(tmp_path):
    import pypdfium2 as pdfium

    buf = io.BytesIO()
    c = canvas.Canvas(buf, pagesize=(PAGE_W, PAGE_H), invariant=1)
    c.rect(100, 600, 40, 40, stroke=0, fill=1)
    c.showPage()
    c.save()
    pdf = pdfium.PdfDocument(buf.getvalue())
    pdf[0].set_rotation(90)  # /Rotate 90: displayed landscape
    pdf.save(tmp_path / "turned.pdf")
    pdf.close()
    index = build_index([tmp_path / "turned.pdf"], tmp_path / "idx", progress=False)
    with TestClient(create_app(index)) as c:
        page = image_of(c.post("/batch_fetch", json={"query": ["image, 1"], "id": ["turned"]}).json()[0])
        assert page.width > page.height  # not squeezed into the unrotated page's shape
        centre = centroid(page)
        (item,) = crop(c, ["turned"], [1], [box_at(centre, 0.3, 0.6, 0.2, 0.2)])
    assert item["source"] == "pdf"
    assert centroid(image_of(item)) == pytest.approx((0.3, 0.6), abs=0.01)
