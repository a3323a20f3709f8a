"""Page roles and headings: detection on generated pages, and what they do to ranking."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from reportlab.lib.pagesizes import letter
from reportlab.pdfgen import canvas

from retriever_server.api.app import create_app
from retriever_server.backends.bm25 import PLAIN, Bm25Backend, heading_weight_for
from retriever_server.indexing import headings, roles
from retriever_server.indexing.indexer import build_index
from retriever_server.indexing.ingest import OcrPolicy, discover, iter_pages
from retriever_server.storage.store import PageStore

SECTIONS = [("Configuring the output terminal", 3), ("Calibrating the plotter pens", 4),
            ("Exporting vector graphics", 5)]
FILLER = ("This chapter walks through the usual steps one at a time and points out where a "
          "setting matters for the result that appears on screen or on paper.")


def _lines(c, x, y, lines, font="Helvetica", size=10, leading=13):
    c.setFont(font, size)
    for line in lines:
        c.drawString(x, y, line)
        y -= leading
    return y


def write_manual(path):
    """A 6-page manual: title page, contents, three body sections, an alphabetical index."""
    c = canvas.Canvas(str(path), pagesize=letter, invariant=1)
    c.setFont("Helvetica-Bold", 24)
    c.drawString(72, 600, "Plotting Handbook")
    c.setFont("Helvetica", 12)
    c.drawString(72, 570, "Second edition")
    c.showPage()
    _lines(c, 72, 720, ["Contents"], "Helvetica-Bold", 16)
    entries = [f"{i}. {title} " + ". " * 30 + f" {page}" for i, (title, page)
               in enumerate(SECTIONS, start=1)]
    entries += [f"{i}.1 Details of {title.split()[-1]} " + ". " * 30 + f" {page}"
                for i, (title, page) in enumerate(SECTIONS, start=1)]
    _lines(c, 72, 690, entries + ["Appendix: glossary of terms " + ". " * 25 + " 6"])
    c.showPage()
    for i, (title, _) in enumerate(SECTIONS, start=1):
        _lines(c, 72, 720, [f"{i} {title}"], "Helvetica-Bold", 16)
        body = [FILLER[:60], FILLER[60:], "Every value is checked before it is used.",
                "Settings can be saved and loaded again later."]
        body = body * 3
        if i == 2:
            # Running text that names the first section: plain BM25 likes this page too.
            body += ["Before calibrating, finish configuring the output terminal (section 1);",
                     "an output terminal that is not set up gives faint pens."]
        _lines(c, 72, 690, body)
        c.showPage()
    _lines(c, 72, 720, ["Index"], "Helvetica-Bold", 16)
    terms = ["calibration, 4", "configuring, 3", "exporting, 5", "graphics, 5", "output, 3, 4",
             "pens, 4", "plotter, 4", "terminal, 3, 4", "vector, 5", "zebra stripes, 6"]
    _lines(c, 72, 690, terms)
    c.showPage()
    c.save()
    return path


@pytest.fixture(scope="module")
def manual(tmp_path_factory):
    return write_manual(tmp_path_factory.mktemp("manual") / "handbook.pdf")


@pytest.fixture(scope="module")
def manual_index(manual, tmp_path_factory):
    return build_index([manual], tmp_path_factory.mktemp("idx") / "idx", progress=False)


# -- detection on generated pages ----------------------------------------------------------------
def test_roles_and_headings_of_generated_pages(manual):
    pages = list(iter_pages(discover([manual])[0], min_pixels=128 * 28 * 28,
                            max_pixels=256 * 28 * 28, jpeg_quality=60, ocr=OcrPolicy("off")))
    assert [p.role for p in pages] == ["front", "contents", "body", "body", "body", "index"]
    assert pages[2].headings == ("1 Configuring the output terminal",)
    assert pages[3].headings == ("2 Calibrating the plotter pens",)
    # Contents and index pages list entries, not headings.
    assert pages[1].headings == () and pages[5].headings == ()


def test_classify_contents_without_a_title():
    lines = ["2 gnuplot 5.4"] + [f"{t} . . . . . . . . . . . {n}" for t, n in
                                 [("Voxel grids", 23), ("New plot styles", 23), ("Pixmaps", 25),
                                  ("Week-date formats", 25), ("Changes", 26), ("Demos", 27)]]
    assert roles.classify(lines, page=12, num_pages=300) == roles.CONTENTS


def test_classify_index_by_group_letters_and_page_lists():
    lines = ["309", "P", "pm3d, 64, 141", "png, 46", "polar, 26, 56", "Q", "qt, 283",
             "quit, 127", "R", "raise, 101"]
    assert roles.classify(lines, page=300, num_pages=311) == roles.INDEX


def test_classify_body_with_some_numbers_stays_body():
    lines = ["Chapter 3: Plotting 41", "The plot command draws functions and data.",
             "Use set xrange [0:10] to limit the axis.", "The default sample count is 100",
             "and can be raised for smooth curves.", "See also the splot command on page 52",
             "which draws surfaces in three dimensions."]
    assert roles.classify(lines, page=41, num_pages=300) == roles.BODY


def test_front_matter_only_among_first_pages():
    notice = ["This manual is for version 4.2.", "Copyright (c) 2022 The Team",
              "Permission is granted to make verbatim copies."] + ["More text here."] * 30
    assert roles.classify(notice, page=2, num_pages=100) == roles.FRONT
    assert roles.classify(notice, page=50, num_pages=100) == roles.BODY


def test_headings_by_size_and_bold():
    lines = [headings.Line("gnuplot 5.4 31", 10.0, 0.0),
             headings.Line("Batch/Interactive Operation", 14.3, 1.0),
             headings.Line("Gnuplot may be executed in either batch or interactive modes", 10.0, 0.1),
             headings.Line("Command line options", 10.0, 1.0),
             headings.Line("Gnuplot accepts the following options on the command line", 10.0, 0.0),
             headings.Line("17", 14.0, 1.0)]
    assert headings.detect(lines) == ("Batch/Interactive Operation", "Command line options")


def test_headings_without_font_data_take_a_short_top_line():
    assert headings.detect([headings.Line("Safety rules"), headings.Line(""),
                            headings.Line("Wear goggles at all times.")]) == ("Safety rules",)
    assert headings.detect([headings.Line("This is a sentence that ends in a period."),
                            headings.Line("More.")]) == ()


def test_running_lines_are_dropped():
    per_page = [("Chapter 2 - page 14", "Vectors"), ("Chapter 2 - page 15",),
                ("Chapter 2 - page 16", "Matrices"), ("Lists",)]
    assert headings.drop_running_lines(per_page) == [("Vectors",), (), ("Matrices",), ("Lists",)]


# -- ranking ---------------------------------------------------------------------------------
def test_section_question_finds_the_section_not_the_contents(manual_index):
    store = PageStore.open(manual_index)
    query = "configuring the output terminal"
    plain = Bm25Backend.from_store(store, ranking=PLAIN).search([query], ["handbook"], 3)[0]
    aware = Bm25Backend.from_store(store).search([query], ["handbook"], 3)[0]
    # Plain BM25 (the oracle of the old behaviour) puts a list page or the page that merely
    # mentions the title first; the page-aware ranking puts the section's page first.
    assert plain[0].page != 3
    assert aware[0].page == 3


def test_contents_and_index_still_found_when_nothing_else_matches(manual_index):
    backend = Bm25Backend.open(manual_index)
    assert backend.search(["glossary of terms"], ["handbook"], 1)[0][0].page == 2
    assert backend.search(["zebra stripes"], ["handbook"], 1)[0][0].page == 6


def test_scores_follow_the_page_aware_formula(manual_index):
    # Oracle: the two fields scored separately with plain BM25 backends, combined by hand.
    store = PageStore.open(manual_index)
    aware = Bm25Backend.from_store(store)
    text_only = Bm25Backend.from_store(store, ranking=PLAIN)
    query = "output terminal"
    role_weight = aware.ranking["role_weights"]
    for row, entry in enumerate(store.manifest.pages):
        heading_hit = any(w in " ".join(entry.headings).lower() for w in ("output", "terminal"))
        expected = text_only.scores(query)[row] * role_weight[entry.role]
        got = aware.scores(query)[row]
        if heading_hit:
            assert got > expected
        else:
            assert got == pytest.approx(expected, rel=1e-6)


def test_heading_weight_shrinks_for_long_queries():
    assert heading_weight_for(3, 1.0, 6) == 1.0
    assert heading_weight_for(12, 1.0, 6) == pytest.approx(0.5)
    assert heading_weight_for(12, 0.0, 6) == 0.0


def test_search_answers_report_role_and_headings(manual_index):
    with TestClient(create_app(manual_index)) as client:
        hits = client.post("/batch_search", json={"query": ["configuring the output terminal"],
                                                  "id": ["handbook"], "top_n": 2}).json()[0]
    assert hits[0]["role"] == "body"
    assert hits[0]["headings"] == ["1 Configuring the output terminal"]
    assert {"id", "contents", "doc_id", "page", "mime"} <= set(hits[0])


def test_an_index_from_before_roles_ranks_as_plain_bm25(manual_index, tmp_path):
    import json
    import shutil

    from retriever_server.backends import open_backend

    old = shutil.copytree(manual_index, tmp_path / "old")
    manifest = json.loads((old / "manifest.json").read_text())
    for page in manifest["pages"]:
        del page["role"], page["headings"]
    for key in ("ranking", "headings_dir"):
        del manifest["backend"][key]
    (old / "manifest.json").write_text(json.dumps(manifest))
    shutil.rmtree(old / "bm25_headings")
    query = "configuring the output terminal"
    got = open_backend(old).search([query], ["handbook"], 6)[0]
    want = Bm25Backend.open(manual_index, ranking=PLAIN).search([query], ["handbook"], 6)[0]
    assert got == want
