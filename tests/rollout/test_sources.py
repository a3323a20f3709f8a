"""convert-dataset --from <set> (vrag_rollout.data.sources): each public set's own released layout,
written here by hand in small files, read into rows checked against hand-written expectations."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from retriever_server.api.app import create_app
from retriever_server.indexing.indexer import build_index
from vrag_rollout.cli import main as cli_main
from vrag_rollout.core.reward import score_response
from vrag_rollout.data import dataset, sources
from vrag_rollout.data.prompts import AGENT_INSTRUCTIONS

from .test_dataset import make_index


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def rows_of(path: Path) -> list[dict]:
    table = pq.read_table(path).to_pydict()
    return [{"question_id": qid, "doc_id": doc, "gold_pages": json.loads(pages), "answer": json.loads(answer),
             "question": prompt.partition("\nQuestion: ")[2]}
            for qid, doc, pages, answer, prompt in zip(table["question_id"], table["doc_id"], table["gold_pages"],
                                                       table["answer"], table["prompt"])]


def convert(tmp_path: Path, source_format: str, src: Path, **kwargs) -> tuple[list[dict], dataset.ConversionReport]:
    """The set's rows in document scope unless `scope` says (each set's reading is what is tested
    here; the corpus form and the per-set default scope are tested apart)."""
    out = tmp_path / f"{source_format}.parquet"
    kwargs.setdefault("scope", "document")
    report = dataset.convert_dataset(src, out, source_format=source_format, **kwargs)
    return rows_of(out), report


# --- SlideVQA: annotations/qa/<split>.jsonl, decks of slide images, pages 1..20


def slide_qa(qa_id, deck="tokyo-olympics-2020-deck", pages=(3,), answer="42%", question="How many?"):
    return {"deck_name": deck, "deck_url": f"https://www.slideshare.net/x/{deck}",
            "image_urls": [f"https://image.slidesharecdn.com/{deck}/95/{deck}-{k}-1024.jpg" for k in range(1, 21)],
            "qa_id": qa_id, "question": question, "answer": answer, "arithmetic_expression": "None",
            "evidence_pages": list(pages), "reasoning_type": "single-hop", "answer_type": "Single span"}


def test_slidevqa(tmp_path):
    src = write_jsonl(tmp_path / "test.jsonl", [
        slide_qa(101, question="What share of fans watched online?"),
        slide_qa(102, deck="v2.0-roadmap", pages=[1, 20], answer=7, question="How many slides show a chart?"),
    ])
    rows, report = convert(tmp_path, "slidevqa", src)
    assert rows == [
        {"question_id": "101", "doc_id": "tokyo-olympics-2020-deck", "gold_pages": [3], "question":
         "What share of fans watched online?", "answer": {"answer": "42%", "doc_id": "tokyo-olympics-2020-deck",
                                                           "gold_pages": [3], "answerable": True}},
        # a deck is a folder: its id is the whole name, dots included (not a file stem)
        {"question_id": "102", "doc_id": "v2.0-roadmap", "gold_pages": [1, 20], "question": "How many slides show a chart?",
         "answer": {"answer": "7", "doc_id": "v2.0-roadmap", "gold_pages": [1, 20], "answerable": True}},
    ]
    assert (report.rows, report.written, report.unanswerable) == (2, 2, 0)
    assert [d.to_dict() for d in sources.list_documents("slidevqa", src)] == [
        {"doc_id": "tokyo-olympics-2020-deck", "file_name": "tokyo-olympics-2020-deck", "kind": "images"},
        {"doc_id": "v2.0-roadmap", "file_name": "v2.0-roadmap", "kind": "images"}]


@pytest.mark.parametrize("row, field", [
    ({k: v for k, v in slide_qa(1).items() if k != "deck_name"}, "deck_name"),
    (slide_qa(1, pages=[0]), "evidence_pages.0"),             # SlideVQA counts slides from 1
    (slide_qa(1, pages=["3"]), "evidence_pages.0"),
    ({**slide_qa(1), "evidence_pages": "[3]"}, "evidence_pages"),
    (slide_qa(1, answer=None), "answer"),
    (slide_qa(1, answer=True), "answer"),
    ({**slide_qa(1), "qa_id": None}, "qa_id"),
    (slide_qa(7), "qa_id"),                                    # repeats the first row's id
    ("[1, 2]", "<row>"),
    ("{not json", "<json>"),
])
def test_slidevqa_malformed_rows_name_line_and_field(tmp_path, row, field):
    src = write_jsonl(tmp_path / "test.jsonl", [slide_qa(7), row])
    with pytest.raises(dataset.DatasetError) as caught:
        dataset.convert_dataset(src, tmp_path / "t.parquet", source_format="slidevqa")
    assert (caught.value.where, caught.value.field) == ("line 2", field)
    assert not (tmp_path / "t.parquet").exists()


# --- SlideVQA decks missing slides (issue 32, defect 6): the download skips slides that 404


def slide_colour(k: int) -> tuple:
    """Slide k's own colour, so a served page can be told to be slide k whatever its position."""
    return (12 * k, 250 - 12 * k, 60 + 9 * k)


def write_deck(root: Path, deck: str, slides) -> Path:
    """`images/test/<deck>/` as SlideVQA's download leaves it: `<deck>-<slide>-1024.jpg` for the
    slides it got."""
    folder = root / "images" / "test" / deck
    folder.mkdir(parents=True)
    for k in slides:
        Image.new("RGB", (64, 48), slide_colour(k)).save(folder / f"{deck}-{k}-1024.png")
    return folder


def served_slide(http, deck: str, page: int) -> int:
    """Which slide the retriever serves as `page` of `deck` (by its colour)."""
    (item,) = http.post("/batch_fetch", json={"query": [f"image, {page}"], "id": [deck]}).json()
    image = Image.open(io.BytesIO(base64.b64decode(item["contents"]))).convert("RGB")
    colour = np.asarray(image, dtype=float).reshape(-1, 3).mean(axis=0)
    return min(range(1, 21), key=lambda k: float(np.abs(colour - slide_colour(k)).sum()))


@pytest.fixture
def gappy_deck(tmp_path):
    """A deck whose slides 3 and 7 failed to download, and a complete one, indexed."""
    decks = [write_deck(tmp_path, "tokyo-olympics-2020-deck", [k for k in range(1, 11) if k not in (3, 7)]),
             write_deck(tmp_path, "v2.0-roadmap", range(1, 6))]
    return build_index(decks, tmp_path / "index", progress=False, ocr="off")


def test_slidevqa_evidence_pages_are_mapped_to_the_slides_the_index_serves(tmp_path, gappy_deck):
    src = write_jsonl(tmp_path / "test.jsonl", [slide_qa(1, pages=[2, 4]), slide_qa(2, pages=[8]),
                                                slide_qa(3, deck="v2.0-roadmap", pages=[1, 5])])
    rows, report = convert(tmp_path, "slidevqa", src, index_dir=gappy_deck)
    # slides 4 and 8 are served as pages 3 and 6 (slides 3 and 7 are missing; written as positions, pages 4
    # and 8 would show slides 5 and 10); a complete deck is as before
    assert [row["gold_pages"] for row in rows] == [[2, 3], [6], [1, 5]]
    assert [row["answer"]["gold_pages"] for row in rows] == [[2, 3], [6], [1, 5]]
    with TestClient(create_app(gappy_deck)) as http:
        for row, evidence in zip(rows, ([2, 4], [8], [1, 5])):
            assert [served_slide(http, row["doc_id"], page) for page in row["gold_pages"]] == evidence
    assert report.numbering_gaps == [{"doc_id": "tokyo-olympics-2020-deck", "missing": [3, 7],
                                      "gold_pages": "mapped by image number"}]
    assert pq.read_table(tmp_path / "slidevqa.parquet").to_pydict()["page_count"] == [8, 8, 5]


def test_a_slide_the_deck_lacks_is_refused_naming_the_deck_and_its_missing_slides(tmp_path, gappy_deck, capsys):
    src = write_jsonl(tmp_path / "test.jsonl", [slide_qa(1, pages=[2]), slide_qa(2, pages=[5, 7])])
    with pytest.raises(dataset.DatasetError) as caught:
        dataset.convert_dataset(src, tmp_path / "t.parquet", source_format="slidevqa", index_dir=gappy_deck)
    assert (caught.value.where, caught.value.field) == ("line 2", "evidence_pages.1")
    message = str(caught.value)
    assert "\n" not in message
    assert "slide 7 of deck 'tokyo-olympics-2020-deck' is not in the index" in message
    assert "lacks slides 3, 7" in message and "--drop-missing" in message
    assert not (tmp_path / "t.parquet").exists()
    rows, report = convert(tmp_path, "slidevqa", src, index_dir=gappy_deck, drop_missing=True)
    assert [row["question_id"] for row in rows] == ["1"] and report.dropped == ["2"]
    assert report.missing_pages == [{"question_id": "2", "doc_id": "tokyo-olympics-2020-deck", "pages": [7],
                                     "lacking": [3, 7], "where": "line 2"}]
    # the CLI says it in one line, and lists what it dropped
    out = tmp_path / "cli.parquet"
    assert cli_main(["convert-dataset", str(src), "--from", "slidevqa", "--index", str(gappy_deck),
                     "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "slide 7 of deck 'tokyo-olympics-2020-deck'" in err
    assert cli_main(["convert-dataset", str(src), "--from", "slidevqa", "--index", str(gappy_deck),
                     "--out", str(out), "--drop-missing"]) == 0
    printed = capsys.readouterr().out
    assert "gold page(s) [7] not among the images of 'tokyo-olympics-2020-deck' (it lacks 3, 7)" in printed
    assert "'tokyo-olympics-2020-deck' has no image numbered 3, 7" in printed


def test_a_slide_after_the_decks_last_image_is_missing_too(tmp_path, gappy_deck):
    src = write_jsonl(tmp_path / "test.jsonl", [slide_qa(1, deck="v2.0-roadmap", pages=[6])])
    with pytest.raises(dataset.DatasetError,
                       match=r"slide 6 of deck 'v2.0-roadmap' is not in the index.*lacks slides 6;"):
        dataset.convert_dataset(src, tmp_path / "t.parquet", source_format="slidevqa", index_dir=gappy_deck)


def test_other_layouts_keep_positions_and_the_report_names_the_gaps(tmp_path, gappy_deck):
    # a VRAG-layout question about the same folder: its pages are positions, as before; the gap is reported
    src = write_jsonl(tmp_path / "qa.jsonl", [{"uid": "q", "query": "?", "reference_answer": "x",
                                               "meta_info": {"file_name": "tokyo-olympics-2020-deck",
                                                             "reference_page": [3]}}])
    rows, report = convert(tmp_path, "vidoseek", src, index_dir=gappy_deck)
    assert rows[0]["gold_pages"] == [3]
    assert report.numbering_gaps == [{"doc_id": "tokyo-olympics-2020-deck", "missing": [3, 7],
                                      "gold_pages": "read as positions"}]


# --- MMLongBench-Doc: data/samples.json, a JSON array; evidence_pages a list in a string


def longbench(doc_id, question, answer, pages, answer_format, sources_text="['Chart']"):
    return {"doc_id": doc_id, "doc_type": "Research report / Introduction", "question": question, "answer": answer,
            "evidence_pages": pages, "evidence_sources": sources_text, "answer_format": answer_format}


def test_mmlongbench_doc(tmp_path):
    src = tmp_path / "samples.json"
    src.write_text(json.dumps([
        longbench("PH_2016.06.08_Economy-Final.pdf", "Which group is greater?", "Latinos interviewed by cellphone",
                  "[19, 20]", "Str", "['Table']"),
        longbench("PH_2016.06.08_Economy-Final.pdf", "Which group dropped most, and by how much?", "['White', '10%']",
                  "[11]", "List"),
        longbench("Independents-Report.pdf", "What was the share in 2024?", "Not answerable", "[]", "None", "[]"),
        longbench("Independents-Report.pdf", "What is the sum of the two smallest files?", "9259", "[]", "Int"),
    ], indent=4))
    rows, report = convert(tmp_path, "mmlongbench-doc", src)
    econ, indep = "PH_2016.06.08_Economy-Final", "Independents-Report"
    assert [(r["question_id"], r["doc_id"], r["gold_pages"], r["answer"]["answer"], r["answer"]["answerable"])
            for r in rows] == [
        (f"{econ}#1", econ, [19, 20], "Latinos interviewed by cellphone", True),
        (f"{econ}#2", econ, [11], "['White', '10%']", True),   # the list answer as released
        (f"{indep}#1", indep, [], "Not answerable", False),    # unanswerable: kept, labelled
        (f"{indep}#2", indep, [], "9259", True),               # answerable without evidence pages, as released
    ]
    assert rows[0]["question"] == "Which group is greater?"
    assert (report.rows, report.written, report.unanswerable) == (4, 4, 1)
    assert report.to_dict()["unanswerable"] == 1
    # the reward reads the list answer's text and the unanswerable label's answer as they are
    table = pq.read_table(tmp_path / "mmlongbench-doc.parquet").to_pydict()
    assert score_response("<answer>White, 10%</answer>", table["answer"][1])["accuracy"] == 1.0
    assert score_response("<answer>Not answerable</answer>", table["answer"][2])["accuracy"] == 1.0
    assert [d.to_dict() for d in sources.list_documents("mmlongbench-doc", src)] == [
        {"doc_id": econ, "file_name": "PH_2016.06.08_Economy-Final.pdf", "kind": "pdf"},
        {"doc_id": indep, "file_name": "Independents-Report.pdf", "kind": "pdf"}]


@pytest.mark.parametrize("row, field", [
    (longbench("a.pdf", "q", "x", "[3, five]", "Str"), "evidence_pages"),
    (longbench("a.pdf", "q", "x", [3, 5], "Str"), None),        # a real list is read too
    (longbench("a.pdf", "q", "x", "[0]", "Str"), "evidence_pages.0"),
    (longbench("a.pdf", "q", "x", 3, "Str"), "evidence_pages"),
    (longbench("a.pdf", "", "x", "[3]", "Str"), "question"),
    (longbench("a.pdf", "q", None, "[3]", "Str"), "answer"),
    (longbench("a.pdf", "q", "x", "[3]", None), "answer_format"),
    ({k: v for k, v in longbench("a.pdf", "q", "x", "[3]", "Str").items() if k != "doc_id"}, "doc_id"),
])
def test_mmlongbench_doc_malformed_items_name_item_and_field(tmp_path, row, field):
    src = tmp_path / "samples.json"
    src.write_text(json.dumps([longbench("a.pdf", "q0", "y", "[1]", "Str"), row], indent=4))
    if field is None:
        assert convert(tmp_path, "mmlongbench-doc", src)[0][1]["gold_pages"] == [3, 5]
        return
    with pytest.raises(dataset.DatasetError) as caught:
        dataset.convert_dataset(src, tmp_path / "t.parquet", source_format="mmlongbench-doc")
    assert (caught.value.where, caught.value.field) == ("item 2", field)


# --- MMDocIR: MMDocIR_annotations.jsonl, one line per document, page_id counted from 0


def mmdocir_doc(doc_name, questions):
    return {"doc_name": doc_name, "domain": "Research report / Introduction", "page_indices": [18196, 18218],
            "layout_indices": [158789, 158941], "questions": questions}


def mmdocir_q(question, answer, page_ids, kind="['Chart']"):
    return {"Q": question, "A": answer, "page_id": list(page_ids), "type": kind,
            "layout_mapping": [{"page": p, "page_size": [612.0, 792.0], "bbox": [64, 274, 546, 389]} for p in page_ids]}


def test_mmdocir(tmp_path):
    src = write_jsonl(tmp_path / "MMDocIR_annotations.jsonl", [
        mmdocir_doc("PH_2016.06.08_Economy-Final.pdf", [
            mmdocir_q("How do 5% of the Latinos see upward mobility?", "Less well-off", [4]),
            mmdocir_q("Which one is greater?", "Latinos interviewed by cellphone", [18, 19], "['Table']"),
        ]),
        mmdocir_doc("0e94b4197b10096b1f4c699701570fbf.pdf", [mmdocir_q("Where was it conceived?", "Berlin", [0])]),
    ])
    rows, report = convert(tmp_path, "mmdocir", src)
    econ, deck = "PH_2016.06.08_Economy-Final", "0e94b4197b10096b1f4c699701570fbf"
    assert [(r["question_id"], r["doc_id"], r["gold_pages"], r["answer"]) for r in rows] == [
        (f"{econ}#1", econ, [5], {"answer": "Less well-off", "doc_id": econ, "gold_pages": [5], "answerable": True}),
        (f"{econ}#2", econ, [19, 20], {"answer": "Latinos interviewed by cellphone", "doc_id": econ,
                                       "gold_pages": [19, 20], "answerable": True}),
        (f"{deck}#1", deck, [1], {"answer": "Berlin", "doc_id": deck, "gold_pages": [1], "answerable": True}),
    ]
    assert rows[2]["question"] == "Where was it conceived?"
    assert report.rows == 3
    assert [d.to_dict() for d in sources.list_documents("mmdocir", src)] == [
        {"doc_id": econ, "file_name": "PH_2016.06.08_Economy-Final.pdf", "kind": "pdf"},
        {"doc_id": deck, "file_name": "0e94b4197b10096b1f4c699701570fbf.pdf", "kind": "pdf"}]


@pytest.mark.parametrize("line, field", [
    (mmdocir_doc("b.pdf", [mmdocir_q("q", "a", [1]), mmdocir_q("q", "a", [-1])]), "questions.1.page_id.0"),
    (mmdocir_doc("b.pdf", [mmdocir_q("q", "a", [1]), {"Q": "q", "page_id": [1]}]), "questions.1.A"),
    (mmdocir_doc("b.pdf", [mmdocir_q("", "a", [1])]), "questions.0.Q"),
    (mmdocir_doc("b.pdf", ["not a question"]), "questions.0"),
    (mmdocir_doc("b.pdf", {"Q": "q"}), "questions"),
    ({"questions": [mmdocir_q("q", "a", [1])]}, "doc_name"),
    (mmdocir_doc("a.pdf", [mmdocir_q("q", "a", [1])]), "doc_name"),  # the same document twice: its ids repeat
])
def test_mmdocir_malformed_lines_name_line_and_field(tmp_path, line, field):
    src = write_jsonl(tmp_path / "ann.jsonl", [mmdocir_doc("a.pdf", [mmdocir_q("q", "a", [2])]), line])
    with pytest.raises(dataset.DatasetError) as caught:
        dataset.convert_dataset(src, tmp_path / "t.parquet", source_format="mmdocir")
    assert (caught.value.where, caught.value.field) == ("line 2", field)


def test_a_gold_page_past_the_end_is_named_in_the_sets_own_field_and_numbering(tmp_path, capsys):
    index = make_index(tmp_path, {"a": 3})
    src = write_jsonl(tmp_path / "ann.jsonl", [mmdocir_doc("a.pdf", [mmdocir_q("q", "x", [1]),
                                                                     mmdocir_q("r", "y", [2, 3])])])
    with pytest.raises(dataset.DatasetError) as caught:
        dataset.convert_dataset(src, tmp_path / "t.parquet", source_format="mmdocir", index_dir=index)
    assert (caught.value.where, caught.value.field) == ("line 1", "questions.1.page_id.1")
    assert "page 3 (page 4 counted from 1) is past the end of document 'a', which has 3 pages" in caught.value.message
    report = dataset.convert_dataset(src, tmp_path / "t.parquet", source_format="mmdocir", index_dir=index,
                                     drop_missing=True)
    assert report.dropped == ["a#2"] and report.pages_out_of_range[0]["pages"] == [3, 4]
    assert pq.read_table(tmp_path / "t.parquet").to_pydict()["page_count"] == [3]


# --- LongDocURL: LongDocURL*.jsonl, answers of several types, pages counted from 1


def longdoc(question_id, doc_no, answer, pages, answer_format, question="Which?"):
    start = max(1, min(pages or [1]) - 5)
    return {"question_id": question_id, "doc_no": doc_no, "total_pages": 84, "start_end_idx": [start, start + 29],
            "question_type": "extract", "question": question, "answer": answer, "detailed_evidences": "",
            "evidence_pages": list(pages), "evidence_sources": ["Table"], "answer_format": answer_format,
            "task_tag": "Understanding",
            "images": [f"/data/pdf_pngs/4000-4999/{str(doc_no)[:4]}/{doc_no}_{k}.png" for k in range(start - 1, start + 29)],
            "pdf_path": f"/data/ccpdf_zip/4000-4999/{doc_no}.pdf", "subTask": ["Text_Understanding"]}


def test_longdocurl(tmp_path):
    lines = [json.dumps(row) for row in (
        longdoc("free_gemini15_pro_4055915_42_71_8", "4055915", 5, [54], "Integer", "How many judging criteria?"),
        longdoc("extract_fig2tab_4151603_24_53_2", "4151603", ["Table 4.15. Irish samples", "Figure 4.2. RBP and OUR"],
                [42], "List"),
        longdoc("calculate_4055915_1_30_3", "4055915", 0.5, [3, 4], "Float"),
        longdoc("extract_4127644_8_37_9", "4127644", "", [], "None"),
    )]
    lines[2] = lines[2].replace('"answer": 0.5', '"answer": 0.50')  # a number's own text is its answer
    src = write_jsonl(tmp_path / "LongDocURL_public.jsonl", lines)
    rows, report = convert(tmp_path, "longdocurl", src)
    assert [(r["question_id"], r["doc_id"], r["gold_pages"], r["answer"]["answer"], r["answer"]["answerable"])
            for r in rows] == [
        ("free_gemini15_pro_4055915_42_71_8", "4055915", [54], "5", True),
        ("extract_fig2tab_4151603_24_53_2", "4151603", [42], "Table 4.15. Irish samples, Figure 4.2. RBP and OUR", True),
        ("calculate_4055915_1_30_3", "4055915", [3, 4], "0.50", True),
        ("extract_4127644_8_37_9", "4127644", [], "Not answerable", False),
    ]
    assert rows[0]["question"] == "How many judging criteria?" and report.unanswerable == 1
    assert [d.to_dict() for d in sources.list_documents("longdocurl", src)] == [
        {"doc_id": "4055915", "file_name": "4055915.pdf", "kind": "pdf"},
        {"doc_id": "4151603", "file_name": "4151603.pdf", "kind": "pdf"},
        {"doc_id": "4127644", "file_name": "4127644.pdf", "kind": "pdf"}]


@pytest.mark.parametrize("row, field", [
    (longdoc("b", "4000001", ["x", None], [1], "List"), "answer.1"),
    (longdoc("b", "4000001", [], [1], "List"), "answer"),
    (longdoc("b", "4000001", "", [1], "String"), "answer"),
    (longdoc("b", "4000001", {"x": 1}, [1], "String"), "answer"),
    (longdoc("b", "4000001", "x", [0], "String"), "evidence_pages.0"),
    (longdoc("b", None, "x", [1], "String"), "doc_no"),
    (longdoc("a", "4000001", "x", [1], "String"), "question_id"),  # repeats the first row's id
    (longdoc("b", "4000001", "x", [1], 3), "answer_format"),
])
def test_longdocurl_malformed_rows_name_line_and_field(tmp_path, row, field):
    src = write_jsonl(tmp_path / "l.jsonl", [longdoc("a", "4000001", "y", [2], "String"), row])
    with pytest.raises(dataset.DatasetError) as caught:
        dataset.convert_dataset(src, tmp_path / "t.parquet", source_format="longdocurl")
    assert (caught.value.where, caught.value.field) == ("line 2", field)


# --- ViDoSeek: vidoseek.json, {"examples": [...]}, the default layout


def test_vidoseek_is_the_default_and_its_examples_wrapper_is_read(tmp_path):
    example = {"uid": "04d8bb0db929110f204723c56e5386c1d8d21587_2", "query": "What temperature?",
               "reference_answer": "195-205 Centigrade",
               "meta_info": {"file_name": "Pretreatment_of_Switchgrass.pdf", "reference_page": [10, 11],
                             "source_type": "Text", "query_type": "Multi-Hop"}}
    src = tmp_path / "vidoseek.json"
    src.write_text(json.dumps({"examples": [example, {**example, "uid": "b"}]}, indent=4))
    # your own questions (no --from) search their documents; the named set in that scope reads alike
    for kwargs in ({}, {"source_format": "vidoseek", "scope": "document"}):
        dataset.convert_dataset(src, tmp_path / "v.parquet", **kwargs)
        rows = rows_of(tmp_path / "v.parquet")
        assert [r["question_id"] for r in rows] == ["04d8bb0db929110f204723c56e5386c1d8d21587_2", "b"]
        # today's rows, unchanged: no answerable key for the VRAG layout
        assert rows[0]["answer"] == {"answer": "195-205 Centigrade", "doc_id": "Pretreatment_of_Switchgrass",
                                     "gold_pages": [10, 11]}
        # the named set's rows also carry what its evaluation reads; your own questions' do not
        named = ("eval",) if kwargs else ()
        assert pq.read_table(tmp_path / "v.parquet").column_names == list(dataset.COLUMNS) + list(named)
    assert sources.list_documents("vidoseek", src) == [
        sources.Document("Pretreatment_of_Switchgrass", "Pretreatment_of_Switchgrass.pdf", "pdf")]
    evaluation = json.loads(pq.read_table(tmp_path / "v.parquet").column("eval")[0].as_py())
    assert evaluation == {"set": "vidoseek", "document": "Pretreatment_of_Switchgrass", "answer_format": None,
                          "categories": {"source_type": "Text", "query_type": "Multi-Hop"}}


# --- across sets


def test_every_set_reads_to_the_same_record_layout(tmp_path):
    files = {
        "slidevqa": write_jsonl(tmp_path / "s.jsonl", [slide_qa(1, pages=[1])]),
        "mmdocir": write_jsonl(tmp_path / "m.jsonl", [mmdocir_doc("a.pdf", [mmdocir_q("q", "a", [0])])]),
        "longdocurl": write_jsonl(tmp_path / "l.jsonl", [longdoc("x", "4000001", "y", [1], "String")]),
    }
    (tmp_path / "mm.json").write_text(json.dumps([longbench("a.pdf", "q", "x", "[1]", "Str")]))
    files["mmlongbench-doc"] = tmp_path / "mm.json"
    assert set(files) | {"vidoseek"} == set(sources.SOURCE_FORMATS) == set(dataset.SOURCE_FORMATS)
    for name, path in files.items():
        (where, record), = list(sources.read_source(name, path))
        assert where in ("line 1", "item 1")
        assert set(record) == {"uid", "query", "reference_answer", "meta_info", "answerable", "_source", "_eval"}, name
        assert set(record["_eval"]) - {"reference"} == {"answer_format", "categories"}, name
        assert record["meta_info"]["reference_page"] == [1], name  # counted from 1 whatever the set's base
        dataset._Question.model_validate(record)  # what dataset.py validates
    with pytest.raises(ValueError, match="source_format must be one of"):
        list(sources.read_source("docvqa", files["slidevqa"]))
    with pytest.raises(ValueError, match="source_format must be one of"):
        dataset.convert_dataset(files["slidevqa"], tmp_path / "t.parquet", source_format="docvqa")
    with pytest.raises(ValueError, match="page_base is for the vidoseek layout only"):
        dataset.convert_dataset(files["mmdocir"], tmp_path / "t.parquet", source_format="mmdocir", page_base=0)


def test_a_file_of_another_shape_is_refused_by_name(tmp_path):
    src = tmp_path / "one.json"
    src.write_text(json.dumps({"questions": [slide_qa(1)], "split": "test"}, indent=2))
    with pytest.raises(dataset.DatasetError, match=r"line 1: field '<json>': the file is one JSON object"):
        dataset.convert_dataset(src, tmp_path / "t.parquet", source_format="slidevqa")
    src.write_text("")
    with pytest.raises(dataset.DatasetError, match="no questions"):
        dataset.convert_dataset(src, tmp_path / "t.parquet", source_format="longdocurl")


def test_cli_from_a_set_with_its_document_list(tmp_path, capsys):
    src = tmp_path / "samples.json"
    src.write_text(json.dumps([longbench("r.pdf", "q1", "x", "[1]", "Str"),
                               longbench("r.pdf", "q2", "Not answerable", "[]", "None")]))
    out, docs, report = tmp_path / "train.parquet", tmp_path / "docs.json", tmp_path / "report.json"
    assert cli_main(["convert-dataset", str(src), "--from", "mmlongbench-doc", "--out", str(out), "--documents",
                     str(docs), "--report", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "wrote 2 of 2" in printed and "1 unanswerable question kept" in printed and "listed 1 document " in printed
    assert json.loads(docs.read_text()) == [{"doc_id": "r", "file_name": "r.pdf", "kind": "pdf"}]
    assert json.loads(report.read_text())["unanswerable"] == 1
    assert pq.read_table(out).to_pydict()["prompt"][0] == AGENT_INSTRUCTIONS + "\nQuestion: q1"
    # the default layout is vidoseek: this file is not one, and the error says where and what
    assert cli_main(["convert-dataset", str(src), "--out", str(out)]) == 2
    assert "item 1: field 'uid'" in capsys.readouterr().err
    assert cli_main(["convert-dataset", str(src), "--from", "mmdocir", "--out", str(out)]) == 2
    assert "item 1: field 'doc_name': missing" in capsys.readouterr().err
    assert cli_main(["convert-dataset", str(src), "--from", "mmlongbench-doc", "--page-base", "0",
                     "--out", str(out)]) == 2
    assert "page_base is for the vidoseek layout only" in capsys.readouterr().err
