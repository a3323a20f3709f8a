"""Readers of the public document-QA sets, each in its own released layout (`convert-dataset --from`).

Each reader is pure: a file's rows in (`read_source` reads the file), question records out, in
file order, as `(where, record)` with `where` naming the line ("line 3", JSON Lines) or item
("item 3", a JSON array). A record is the
question layout `vrag_rollout.data.dataset` converts, with pages already counted from 1:

    {"uid": ..., "query": ..., "reference_answer": ...,
     "meta_info": {"file_name": ..., "reference_page": [1-based pages]},
     "answerable": true | false,
     "_source": {"set", "doc_id", "kind", "page_field", "page_base", "id_field",
                 "pages_are_numbers"},
     "_eval": {"answer_format", "categories"}}

`_eval` holds what the evaluation report reads: the set's answer format where its scoring uses
one, a list answer's items (`reference`, LongDocURL: the answer text joins them), and its own
category fields (`categories`: e.g. MMLongBench-Doc's `evidence_sources`,
SlideVQA's `reasoning_type`), written by `convert-dataset` into the `eval` column.
`_source` says where the record came from, so that a later error (a gold page past its
document's end in the index, a repeated question id) names the set's own field and page number; `doc_id` is the id
`vrag-retriever index` gives the document (a PDF's stem, an image folder's name) and `kind`
whether the index must hold a PDF ("pdf") or a folder of page images ("images");
`pages_are_numbers` is true where the gold pages are the numbers in the page images' file names
(SlideVQA's slide numbers), not positions in the document.
A malformed row raises `SourceError` naming its line or item and the set's own field (list
positions counted from 0, as in `questions.2.page_id.1`), worded as `dataset.py` words its own
(a required field absent is `missing`); no field is guessed and no row skipped. A row that
holds the telling fields of another layout (`SIGNATURES`) has its error say so and name the
`--from` that reads it (`layout_hint`); each layout's fields are listed for users in
docs/datasets.md.
Answers that are numbers are written as their source text (`3.50` stays "3.50"); true/false and
null are refused. `documents(...)` lists the documents the index must hold.

What each reader reads (facts from the sets' own releases; field names as they spell them):

- `vidoseek` (the default; the VRAG layout `dataset.py` reads itself). Layout documented in the
  ViDoRAG README (github.com/Alibaba-NLP/ViDoRAG, README.md, "ViDoSeek Dataset"), the file
  `vidoseek.json` on the Hugging Face hub (autumncc/ViDoSeek): per question `uid`, `query`,
  `reference_answer`, `meta_info.file_name` (a PDF), `meta_info.reference_page` (a list of
  1-based pages), `meta_info.source_type`, `meta_info.query_type`. The README does not show the
  file's top level; public code that reads `vidoseek.json` takes the list from its "examples" key,
  so `{"examples": [...]}` is read (as are a plain array, `{"data": [...]}` and JSON Lines). The
  README says each query has a unique answer: there is no unanswerable label.
- `slidevqa`: github.com/nttmdlab-nlp/SlideVQA, README.md ("QA format"): JSON Lines
  (`annotations/qa/{train,dev,test}.jsonl`, the names its scripts read), per question `deck_name`,
  `qa_id`, `question`, `answer`, `evidence_pages` (a list of pages "1 - 20", 1-based), plus
  `deck_url`, `image_urls`, `arithmetic_expression`, `reasoning_type`, `answer_type` (not read).
  Documents are decks of 20 slide images; its download script saves them as
  `images/<split>/<deck_name>/<image file>`, the file named as the last part of its URL
  (SlideShare's `<deck>-<slide>-<width>.jpg`), so a deck is a folder of images named `deck_name`
  (kind "images"). The README warns that some slides fail to download (404): a deck folder may lack
  slides. The index records each image's own slide number from its file name
  (`retriever_server.indexing.ingest.image_numbers`) while numbering pages by position, so
  evidence pages are slide numbers to map, not positions: the record says so (`_source.pages_are_numbers`) and
  `dataset.convert_rows` maps them through the index, refusing (or dropping) a question whose
  evidence slide the deck lacks. No unanswerable label.
  The Hugging Face copy (NTT-hil-insight/SlideVQA, parquet with the slides as image columns) is
  not read here: export its QA fields as JSON Lines and its slides as folders, each image named
  by its slide number (`slide_3.png`).
- `mmlongbench-doc`: github.com/mayubo2333/MMLongBench-Doc, `data/samples.json` (also the
  Hugging Face dataset yubo2333/MMLongBench-Doc): one JSON array; per question `doc_id` (the PDF's
  file name, `data/documents/<doc_id>`), `question`, `answer` (a string; list answers are written
  as a Python list in a string, "['White', '10%']", kept as released: the reward's normalization
  drops the brackets and quotes), `evidence_pages` (a list written as a STRING, "[3, 5]",
  1-based), `evidence_sources` (also a string), `answer_format` ("Str", "Int", "Float", "List",
  "None"), `doc_type`. Unanswerable questions have `answer_format` "None" (and the answer "Not
  answerable", evidence "[]"): kept, with `answerable: false`. There is no question id: the uid
  is `<doc_id stem>#<n>`, n counting that document's questions from 1 in file order.
- `mmdocir`: github.com/MMDocRAG/MMDocIR, `dataset/MMDocIR_annotations.jsonl` (documented in
  `dataset/README.md` there): JSON Lines, one line per DOCUMENT: `doc_name` (a PDF file name),
  `domain`, `page_indices`, `layout_indices` (spelt `layout_indinces` in the README; neither is
  read), and `questions`, a list of `{"Q", "A", "page_id", "type", "layout_mapping"}`. `page_id`
  counts pages from 0: the same questions in MMLongBench-Doc carry each page one higher
  (evidence "[5]" is page_id [4]; "the table on page 98" is page_id [97]). MMDocIR releases its
  pages as screenshots (`MMDocIR_pages.parquet` on the hub, MMDocIR/MMDocIR_Evaluation_Dataset),
  not the PDFs; index the PDFs (kind "pdf", doc_id the stem of `doc_name`), or the screenshots
  as one folder per document named that stem. No unanswerable label; no question id: the uid
  is `<doc_name stem>#<n>`, n the question's position in `questions` counted from 1.
- `longdocurl`: github.com/dengc2023/LongDocURL (`data/LongDocURL.jsonl`) and the Hugging Face
  dataset dengchao/LongDocURL (`LongDocURL_public.jsonl`, `LongDocURL_public_with_subtask_category.jsonl`;
  its README.md documents the fields): JSON Lines; per question `question_id`, `doc_no` (the PDF's
  7-digit file name, without ".pdf"), `question`, `answer` (a string, a number or a list: a list
  is written as its items joined by ", "), `evidence_pages` (a list, 1-based: the README says
  pages count from 1 except the `images` list, which counts from 0), `answer_format` ("String",
  "Float", "Integer", "List", "None"), plus `total_pages`, `start_end_idx`, `question_type`,
  `task_tag`, `evidence_sources`, `detailed_evidences`, `images`, `pdf_path`, `subTask` (not read).
  Documents are the PDFs `<doc_no>.pdf` (kind "pdf"). NOT CONFIRMED: the release does not say
  what `answer_format` "None" means; we read it as unanswerable (`answerable: false`, as in
  MMLongBench-Doc, from the same answer-format scheme), keeping its answer text, or "Not
  answerable" if it has none. No such record was seen.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

from .question_text import question_text
from .json_numbers import loads, number_text

SOURCE_FORMATS = ("vidoseek", "slidevqa", "mmlongbench-doc", "mmdocir", "longdocurl")
DEFAULT_FORMAT = "vidoseek"
NOT_ANSWERABLE = "Not answerable"  # MMLongBench-Doc's answer to its unanswerable questions
MISSING = "missing"  # the one wording of an absent required field, in every layout (dataset.py too)
WRAPPERS = ("examples", "data")  # keys of an object that holds the rows: ViDoSeek's {"examples": [...]}


class SourceError(ValueError):
    """A malformed row of a set's file: `where` is 'line N', 'item N' or 'file', `field` the set's
    own field path. `dataset.convert_rows` raises it again as its `DatasetError`. `value`: the
    JSON object at fault when it is not a row (the whole file), for `read_source`'s layout guess."""

    def __init__(self, where: str, field_path: str, message: str, value: Any = None):
        super().__init__(f"{where}: field {field_path!r}: {message}")
        self.where, self.field, self.message, self.value = where, field_path, message, value


@dataclass(frozen=True)
class Document:
    """A document the index must hold: its id, the file or folder name, "pdf" or "images"."""

    doc_id: str
    file_name: str
    kind: str

    def to_dict(self) -> dict:
        return {"doc_id": self.doc_id, "file_name": self.file_name, "kind": self.kind}


# --- JSON, keeping a number's own text


_loads = loads  # json_numbers.loads: numbers keep their source text


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    kinds = ((bool, "true or false"), (int, "an integer"), (float, "a number with a fraction"), (str, "a string"),
             (list, "a list"), (dict, "an object"))
    return next((name for kind, name in kinds if isinstance(value, kind)), type(value).__name__)


def _items(path: Path, wrappers: tuple = ()) -> Iterator[tuple[str, Any]]:
    """The rows of a JSON array ("item N"), of an object holding one under a `wrappers` key, or of
    JSON Lines ("line N"; one object per line, blank lines skipped)."""
    text = question_text(path)  # a clear message for a PDF, a parquet file or non-UTF-8 bytes
    lines = text.splitlines()
    whole: Any = None
    if text.lstrip()[:1] in ("[", "{"):
        try:
            whole = _loads(text)
        except json.JSONDecodeError as error:
            if text.lstrip().startswith("["):
                raise SourceError(f"line {error.lineno}", "<json>", f"not valid JSON: {error.msg}") from None
    wrapped = next((whole[key] for key in wrappers if isinstance(whole, dict) and isinstance(whole.get(key), list)),
                   None)
    if isinstance(whole, list) or wrapped is not None:
        for number, item in enumerate(whole if isinstance(whole, list) else wrapped, start=1):
            yield f"item {number}", item
        return
    if isinstance(whole, dict) and sum(1 for line in lines if line.strip()) > 1:
        keys = ", ".join(repr(key) for key in list(whole)[:8])
        held = f", or an object holding it under {' or '.join(map(repr, wrappers))}" if wrappers else ""
        raise SourceError("line 1", "<json>", f"the file is one JSON object (keys {keys or 'none'}), not rows: "
                                              f"expected JSON Lines (one object per line) or a JSON array{held}",
                          whole)
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                yield f"line {number}", _loads(line)
            except json.JSONDecodeError as error:
                raise SourceError(f"line {number}", "<json>", f"not valid JSON: {error.msg}") from None


# --- field checks, in the set's own field names


def _object(where: str, row: Any, name: str = "<row>") -> dict:
    if not isinstance(row, dict):
        raise SourceError(where, name, f"expected a JSON object, got {_kind_of(row)}")
    return row


def _field(where: str, row: dict, name: str, path: Optional[str] = None) -> Any:
    if name not in row:
        raise SourceError(where, path or name, MISSING)
    return row[name]


def _text(where: str, row: dict, name: str, path: Optional[str] = None) -> str:
    value = _field(where, row, name, path)
    if not isinstance(value, str) or not value.strip():
        got = "an empty string" if isinstance(value, str) else _kind_of(value)
        raise SourceError(where, path or name, f"expected a non-empty string, got {got}")
    return value


def _id_text(where: str, row: dict, name: str, path: Optional[str] = None) -> str:
    """An id: a non-empty string or an integer, as text."""
    value = _field(where, row, name, path)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value
    raise SourceError(where, path or name, f"expected a string or an integer, got {_kind_of(value)}")


def _scalar_text(value: Any) -> Optional[str]:
    """A string, or a number as its source text; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return number_text(value)
    if isinstance(value, str):
        return value
    return None


def _answer(where: str, row: dict, name: str, path: Optional[str] = None, *, lists: bool = False,
            missing_ok: bool = False) -> Optional[str]:
    """The answer text: a string or a number (as its source text); with `lists`, a list of those
    joined by ", ". None only with `missing_ok` for an absent, null or empty answer."""
    path = path or name
    value = row.get(name)
    if missing_ok and value in (None, "", []):
        return None
    if name not in row:
        raise SourceError(where, path, MISSING)
    if lists and isinstance(value, list):
        parts = [_scalar_text(item) for item in value]
        bad = next((i for i, part in enumerate(parts) if part is None or not part.strip()), None)
        if bad is not None:
            raise SourceError(where, f"{path}.{bad}", f"expected a non-empty string or a number, "
                                                      f"got {_kind_of(value[bad])}")
        if not parts:
            raise SourceError(where, path, "an empty list has no answer text")
        return ", ".join(parts)
    text = _scalar_text(value)
    if isinstance(value, bool):
        raise SourceError(where, path, "got true or false, which has no one answer text (\"yes\"? \"true\"?)")
    if text is None:
        expected = "a string, a number or a list of those" if lists else "a string or a number"
        raise SourceError(where, path, f"expected {expected}, got {_kind_of(value)}")
    if not text.strip():
        raise SourceError(where, path, "expected a non-empty string or a number, got an empty string")
    return text


def _pages(where: str, value: Any, path: str, base: int) -> list[int]:
    """Pages counted from `base` (a list of integers, none below `base`), counted from 1."""
    if not isinstance(value, list):
        raise SourceError(where, path, f"expected a list of page numbers, got {_kind_of(value)}")
    for position, page in enumerate(value):
        if not isinstance(page, int) or isinstance(page, bool):
            raise SourceError(where, f"{path}.{position}", f"expected an integer page number, got {_kind_of(page)}")
        if page < base:
            raise SourceError(where, f"{path}.{position}",
                              f"page {page} is below this set's first page number {base}")
    return [page - base + 1 for page in value]


def _stem(file_name: str) -> str:
    return Path(file_name).stem  # the id `vrag-retriever index` gives a PDF


def _record(uid: str, query: str, answer: str, file_name: str, pages: list, *, answerable: bool, set_name: str,
            doc_id: str, kind: str, page_field: str, page_base: int, id_field: str,
            pages_are_numbers: bool = False, answer_format: Optional[str] = None,
            categories: Optional[dict] = None, reference: Optional[list] = None) -> dict:
    evaluation = {"answer_format": answer_format, "categories": _categories(categories or {})}
    if reference is not None:  # a list answer as the set's scoring reads it (the answer text joins it)
        evaluation["reference"] = reference
    return {"uid": uid, "query": query, "reference_answer": answer,
            "meta_info": {"file_name": file_name, "reference_page": pages},
            "answerable": answerable,
            "_source": {"set": set_name, "doc_id": doc_id, "kind": kind, "page_field": page_field,
                        "page_base": page_base, "id_field": id_field, "pages_are_numbers": pages_are_numbers},
            "_eval": evaluation}


def _categories(found: dict) -> dict:
    """The set's own category fields of a question, for the evaluation report's breakdown: text
    values as they are, a list written as a string ("['Chart', 'Table']") read as a list; empty
    and other values left out (a category is a label, never an error)."""
    out = {}
    for name, value in found.items():
        if isinstance(value, str) and value.strip().startswith("["):
            try:
                value = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                pass
        if isinstance(value, list):
            value = [str(item) for item in value if isinstance(item, (str, int)) and str(item).strip()]
        if isinstance(value, str) and value.strip() or isinstance(value, list) and value:
            out[name] = value
    return out


def _list_answer(value: Any) -> Optional[list]:
    """A list answer's items as texts (numbers as their source text), or None for any other."""
    if not isinstance(value, list):
        return None
    return [item if isinstance(item, str) else number_text(item) for item in value]


def vidoseek_categories(meta_info: dict) -> dict:
    """ViDoSeek's categories (`meta_info.source_type`, `meta_info.query_type`)."""
    return _categories({name: meta_info.get(name) for name in ("source_type", "query_type")})


# --- one reader per set


Rows = Iterable[tuple[str, Any]]  # a file's rows as `_items` reads them: ("line 3" or "item 3", row)


def read_vidoseek(rows: Rows) -> Iterator[tuple[str, dict]]:
    """ViDoSeek's `vidoseek.json` (or any VRAG-style file): the questions as they are, the document
    checked (`meta_info.file_name`); `dataset.convert_rows` validates the rest itself."""
    for where, row in rows:
        row = _object(where, row)
        meta = _object(where, _field(where, row, "meta_info"), "meta_info")
        file_name = _text(where, meta, "file_name", "meta_info.file_name")
        kind = "pdf" if file_name.lower().endswith(".pdf") else "images"
        yield where, {**row, "_source": {"set": "vidoseek", "doc_id": _stem(file_name), "kind": kind,
                                         "page_field": "meta_info.reference_page", "page_base": 1,
                                         "id_field": "uid"},
                      "_eval": {"answer_format": None, "categories": vidoseek_categories(meta)}}


def read_slidevqa(rows: Rows) -> Iterator[tuple[str, dict]]:
    for where, row in rows:
        row = _object(where, row)
        deck = _text(where, row, "deck_name")
        yield where, _record(_id_text(where, row, "qa_id"), _text(where, row, "question"), _answer(where, row, "answer"),
                             deck, _pages(where, _field(where, row, "evidence_pages"), "evidence_pages", 1),
                             answerable=True, set_name="slidevqa", doc_id=deck, kind="images",
                             page_field="evidence_pages", page_base=1, id_field="qa_id",
                             pages_are_numbers=True, answer_format=row.get("answer_type"),
                             categories={"reasoning_type": row.get("reasoning_type"),
                                         "answer_type": row.get("answer_type")})


def _page_list_text(where: str, value: Any, path: str) -> Any:
    """MMLongBench-Doc's `evidence_pages`: a list written as a string ("[3, 5]"); a real list too."""
    if isinstance(value, list):
        return value
    if not isinstance(value, str):
        raise SourceError(where, path, f'expected a list of pages written as a string, like "[3, 5]", '
                                       f"got {_kind_of(value)}")
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise SourceError(where, path, f'expected a list of pages written as a string, like "[3, 5]", '
                                       f"got {value!r}") from None


def read_mmlongbench_doc(rows: Rows) -> Iterator[tuple[str, dict]]:
    counts: dict = {}
    for where, row in rows:
        row = _object(where, row)
        file_name = _text(where, row, "doc_id")
        answer_format = _field(where, row, "answer_format")
        if not isinstance(answer_format, str):
            raise SourceError(where, "answer_format", f"expected a string, got {_kind_of(answer_format)}")
        answerable = answer_format != "None"
        answer = _answer(where, row, "answer", missing_ok=not answerable) or NOT_ANSWERABLE
        pages = _pages(where, _page_list_text(where, _field(where, row, "evidence_pages"), "evidence_pages"),
                       "evidence_pages", 1)
        doc_id = _stem(file_name)
        counts[doc_id] = counts.get(doc_id, 0) + 1
        yield where, _record(f"{doc_id}#{counts[doc_id]}", _text(where, row, "question"), answer, file_name, pages,
                             answerable=answerable, set_name="mmlongbench-doc", doc_id=doc_id, kind="pdf",
                             page_field="evidence_pages", page_base=1, id_field="doc_id", answer_format=answer_format,
                             categories={"evidence_sources": row.get("evidence_sources"),
                                         "answer_format": answer_format, "doc_type": row.get("doc_type")})


def read_mmdocir(rows: Rows) -> Iterator[tuple[str, dict]]:
    for where, row in rows:
        row = _object(where, row)
        file_name = _text(where, row, "doc_name")
        questions = _field(where, row, "questions")
        if not isinstance(questions, list):
            raise SourceError(where, "questions", f"expected a list of questions, got {_kind_of(questions)}")
        doc_id = _stem(file_name)
        for k, item in enumerate(questions):
            at = f"questions.{k}"
            item = _object(where, item, at)
            pages = _pages(where, _field(where, item, "page_id", f"{at}.page_id"), f"{at}.page_id", 0)
            yield where, _record(f"{doc_id}#{k + 1}", _text(where, item, "Q", f"{at}.Q"),
                                 _answer(where, item, "A", f"{at}.A"), file_name, pages, answerable=True,
                                 set_name="mmdocir", doc_id=doc_id, kind="pdf", page_field=f"{at}.page_id",
                                 page_base=0, id_field="doc_name",
                                 categories={"type": item.get("type"), "domain": row.get("domain")})


def read_longdocurl(rows: Rows) -> Iterator[tuple[str, dict]]:
    for where, row in rows:
        row = _object(where, row)
        doc_no = _id_text(where, row, "doc_no")
        answer_format = row.get("answer_format")
        if answer_format is not None and not isinstance(answer_format, str):
            raise SourceError(where, "answer_format", f"expected a string, got {_kind_of(answer_format)}")
        answerable = answer_format != "None"
        answer = _answer(where, row, "answer", lists=True, missing_ok=not answerable) or NOT_ANSWERABLE
        pages = _pages(where, _field(where, row, "evidence_pages"), "evidence_pages", 1)
        yield where, _record(_id_text(where, row, "question_id"), _text(where, row, "question"), answer,
                             f"{doc_no}.pdf", pages, answerable=answerable, set_name="longdocurl", doc_id=doc_no,
                             kind="pdf", page_field="evidence_pages", page_base=1, id_field="question_id",
                             answer_format=answer_format, reference=_list_answer(row.get("answer")),
                             categories={"task_tag": row.get("task_tag"), "answer_format": answer_format,
                                         "evidence_sources": row.get("evidence_sources"),
                                         "question_type": row.get("question_type")})


# Each set's reader, and the keys of an object that may hold its rows (ViDoSeek's {"examples": [...]}).
READERS: dict[str, tuple[Callable[[Rows], Iterator[tuple[str, dict]]], tuple]] = {
    "vidoseek": (read_vidoseek, WRAPPERS),
    "slidevqa": (read_slidevqa, ()),
    "mmlongbench-doc": (read_mmlongbench_doc, ()),
    "mmdocir": (read_mmdocir, ()),
    "longdocurl": (read_longdocurl, ()),
}


class _Remembered:
    """The rows of a file, remembering the last one handed out (to guess its layout on an error)."""

    def __init__(self, rows: Rows):
        self.rows, self.last = rows, None

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for where, row in self.rows:
            self.last = row
            yield where, row


def read_source(source_format: str, path: Path) -> Iterator[tuple[str, dict]]:
    """The records of `path`, read as `source_format` (one of `SOURCE_FORMATS`). A row's
    `SourceError` says which other layout the row looks like, if any (`layout_hint`)."""
    if source_format not in READERS:
        raise ValueError(f"source_format must be one of {', '.join(SOURCE_FORMATS)}, got {source_format!r}")
    reader, wrappers = READERS[source_format]
    rows = _Remembered(_items(Path(path), wrappers))
    try:
        yield from reader(rows)
    except SourceError as error:
        at_fault = error.value if error.value is not None else rows.last
        raise SourceError(error.where, error.field,
                          error.message + layout_hint(at_fault, source_format, error.message)) from None


# --- which layout a row looks like

# The fields each layout's rows always hold (the fields that tell the layouts apart).
SIGNATURES = {
    "vidoseek": ("uid", "query", "reference_answer", "meta_info"),
    "slidevqa": ("deck_name", "qa_id", "question", "evidence_pages"),
    "mmlongbench-doc": ("doc_id", "question", "evidence_pages", "answer_format"),
    "mmdocir": ("doc_name", "questions"),
    "longdocurl": ("question_id", "doc_no", "question", "evidence_pages"),
}
LAYOUTS_DOC = "docs/datasets.md"  # where each layout's fields are listed


def guess_layout(row: Any) -> Optional[str]:
    """The layout whose telling fields (`SIGNATURES`) the row holds all of, the one with the most
    such fields if several; None for a row that holds no layout's, or is no JSON object. An object
    holding a list of rows under a `WRAPPERS` key is guessed by its first row."""
    if not isinstance(row, dict):
        return None
    wrapped = next((row[key] for key in WRAPPERS if isinstance(row.get(key), list) and row[key]), None)
    if wrapped is not None and not any(key in row for key in SIGNATURES[DEFAULT_FORMAT]):
        return guess_layout(wrapped[0])
    held = [name for name, keys in SIGNATURES.items() if all(key in row for key in keys)]
    return max(held, key=lambda name: len(SIGNATURES[name]), default=None)


def layout_hint(row: Any, source_format: str, message: str = "") -> str:
    """The words to add to a row's error read as `source_format`: which other layout the row looks
    like and the flag that reads it; for a missing field of a row of no known layout, where the
    layout's fields are listed; else nothing."""
    guess = guess_layout(row)
    if guess is not None and guess != source_format:
        if guess == DEFAULT_FORMAT:
            return f" (this looks like the {guess} layout, the default: leave --from out)"
        return f" (this looks like the {guess} layout: pass --from {guess})"
    if guess is None and message == MISSING:
        return f" (the {source_format} layout's fields are listed in {LAYOUTS_DOC})"
    return ""


def documents(records: Iterable[tuple[str, dict]]) -> list[Document]:
    """The documents the records name, in first-seen order, each once."""
    seen: dict = {}
    for _, record in records:
        source = record["_source"]
        if source["doc_id"] not in seen:
            seen[source["doc_id"]] = Document(source["doc_id"], record["meta_info"]["file_name"], source["kind"])
    return list(seen.values())


def list_documents(source_format: str, path: Path) -> list[Document]:
    """The documents a set's file names: what `vrag-retriever index` must be given (PDFs, or one
    folder of page images per deck) for its questions to be served."""
    return documents(read_source(source_format, path))
