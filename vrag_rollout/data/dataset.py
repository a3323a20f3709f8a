"""VRAG-style document-QA JSON -> the EasyR1 trainer's parquet (`vrag-rollout convert-dataset`).

Input (UTF-8, a byte-order mark allowed): a JSON array of questions, the common wrapper
`{"data": [questions]}` or ViDoSeek's `{"examples": [questions]}` (an object with such a list and
none of a question's keys, so it cannot be a question itself; its other keys are ignored), or JSON
Lines (one question object per line), each

    {"uid": "q1", "query": "...", "reference_answer": "...",
     "meta_info": {"file_name": "report.pdf", "reference_page": [3, 5], ...}}

(other keys are allowed and ignored). Any other single JSON object is refused, saying what it is
and what is expected. `reference_answer` is a string or a number; a number is written as its
source text (`12` -> "12", `3.50` -> "3.50"); true/false, null, lists and objects are refused
(a boolean has no one answer text: "yes"? "true"?). `reference_page` numbers are 1-based unless
`page_base=0` says the source counts from 0; they are written 1-based, like the retriever's
page ids. The document id is the file name's stem, the rule `vrag-retriever index` uses.

Output columns (one row per question, in input order; no list columns, because EasyR1's
collate turns equal-length lists into a 2-D object array):
- `prompt`: the agent's instructions for the action format (`vrag_rollout.data.prompts.AGENT_INSTRUCTIONS`
  for tags, `TOOL_CALL_INSTRUCTIONS` for tool_call; with `region_action`, plus the region action's
  sentence: `prompts.instructions_for`) and the question, as the rollout's demo
  prompts are written (EasyR1 builds a single user turn from it; in a tool_call run the
  integration adds the tool schemas to the system turn);
- `answer`: a JSON object `{"answer", "doc_id", "gold_pages"}`, EasyR1's `ground_truth`, read by
  `vrag_rollout.core.reward`;
- `doc_id`: the document the rollout searches; null in corpus scope (below);
- `gold_pages`: the gold pages as a JSON list (for reading; the reward uses `answer`);
- `question_id`: the input's `uid` as a string (EasyR1 sets its own `uid` column per batch);
- `page_count` (with an index only): the document's page count in that index, null for a
  document it lacks; the rollout's preflight refuses a retriever that serves another count;
- `eval` (with `source_format` named, a public set): what `vrag-rollout evaluate` scores by, as
  JSON `{"set", "document", "answer_format", "categories"}`: the set, the question's own
  document (in either scope), the answer format its scoring reads (MMLongBench-Doc, LongDocURL)
  and the set's own category fields for the report (`sources`' `_eval`).

`layout="verl"` writes the same rows in the columns verl's `RLHFDataset` and agent loops read
(docs/verl.md): `prompt` as chat messages (one user turn), `agent_name` ("vrag_agent"),
`data_source`, `reward_model` (`{"ground_truth": <the answer JSON>, "style": "rule"}`),
`extra_info` (`{"index", "question_id", "gold_pages"}`), `doc_id` and, with an index,
`page_count`.

`scope` says what the rollout searches (`formats.base.SCOPES`, `core.scope`): "document", each
question's own document (the rows above), or "corpus", the whole index: `doc_id` is null, the
prompt carries the format's corpus instructions, and each gold page is a `[document, page]` pair
(`{"answer", "doc_id": null, "gold_pages": [["report", 3]]}`; `page_count` null). The default is
the set's own protocol (`DEFAULT_SCOPES`: corpus for the named ViDoSeek and SlideVQA sets, as
VRAG-RL trains them; document for the others and for your own questions, `source_format` None).
The index checks below hold in both scopes (each question still has its document).

With `val_out` and `val_fraction`, a stable share of the rows goes to a second parquet instead
(`split_of`: by a hash of the question id, or of the document id so that no validation document
is trained on); the same input always splits the same way, whatever its order.

A malformed row raises `DatasetError` naming its line (JSON Lines) or item (array, "data") and the
field; so does an input with no questions, or none left to write. Nothing is written then.
With a retriever index (`index_dir`; a path that is not one raises `IndexDirError` naming it):
- a question whose document the index lacks is listed in the report and kept (the rollout's
  preflight refuses it later: its entry records the `file` and `row`, from 1, it was written to,
  and `convert-dataset` ends with a warning naming them and `--drop-missing`), or left out and
  listed as dropped with `drop_missing`;
- a path that is a folder but no index (a folder of PDFs, say) raises `IndexDirError` with the
  `vrag-retriever index` command that builds one into a new directory
  (`retriever_server.indexing.suggest.not_an_index`);
- a gold page past its document's end in the index is never written: the row raises
  `DatasetError` (line, page, the document's page count), or with `drop_missing` is left out and
  listed (`pages_out_of_range`, `dropped`). Without an index page counts are not checked.
- gold pages that a set writes as the numbers in its page images' file names (SlideVQA's slide
  numbers: `_source.pages_are_numbers`) are mapped through the numbers the index recorded for
  that folder (`Manifest.source_numbers`) to the positions the retriever serves them at: a deck
  missing slide 3 serves slide 4 as page 3, and a gold slide 4 is written as 3. A gold slide the
  folder lacks raises `DatasetError` naming the deck and the slides it lacks, or with
  `drop_missing` is left out and listed (`missing_pages`, `dropped`). Pages of other layouts, and
  of folders whose images are not numbered (or an index from before numbers were recorded), are
  positions, as before.
- each document a question uses whose numbered images skip numbers is listed once
  (`numbering_gaps`: its missing numbers and whether its gold pages were mapped by number or read
  as positions).
Nothing is dropped silently.

`source_format` (`convert-dataset --from`) names the input's layout: "vidoseek" (or None, the
default: your own questions) is the layout above; the public sets' own layouts ("slidevqa", "mmlongbench-doc", "mmdocir",
"longdocurl") are read by `vrag_rollout.data.sources` (their fields, page bases and documents
are described there, and for users in docs/datasets.md) into the same question records, their
pages counted from 1. Errors are worded alike in every layout (a required field absent is
`missing`: pydantic's messages are reworded, `_WORDING`), and a row of another layout says
which (`sources.layout_hint`). The sets' errors name the set's own fields, and their rows'
`answer` JSON also holds `"answerable"`: false for a question the set marks unanswerable (kept,
with the set's answer, e.g. "Not answerable", and no gold pages), true otherwise.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Iterator, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, ValidationError
from pydantic_core import PydanticCustomError

from retriever_server.indexing.suggest import no_index_at

from .question_text import question_text
from .json_numbers import SourceNumber, loads
from ..formats import FORMATS
from ..formats.base import SCOPES
from .prompts import AGENT_INSTRUCTIONS, instructions_for
from .sources import MISSING, layout_hint
from .writing import EVAL, PAGE_COUNT, in_validation, rows_where, split_keys, write_easyr1, write_verl

COLUMNS = ("prompt", "answer", "doc_id", "gold_pages", "question_id")
SPLIT_KEYS = {"question": "question_id", "document": "doc_id"}
LAYOUTS = ("easyr1", "verl")
SOURCE_FORMATS = ("vidoseek", "slidevqa", "mmlongbench-doc", "mmdocir", "longdocurl")  # = sources.SOURCE_FORMATS
# The sets VRAG-RL trains and scores over one merged corpus; the others search each question's
# own document (their papers' protocol), as do your own questions (no source format).
DEFAULT_SCOPES = {"vidoseek": "corpus", "slidevqa": "corpus"}


class DatasetError(ValueError):
    """A malformed input row: `where` is 'line N', 'item N' or 'file' (the whole input), `field`
    the dotted field path."""

    def __init__(self, where: str, field_path: str, message: str):
        super().__init__(f"{where}: field {field_path!r}: {message}")
        self.where, self.field, self.message = where, field_path, message


class IndexDirError(ValueError):
    """An `index_dir` that is not a readable retriever index; the message names the path."""

    def __init__(self, index_dir: Path, message: str):
        super().__init__(f"{index_dir}: {message}")
        self.index_dir, self.message = Path(index_dir), message


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return "a number with a fraction" if math.isfinite(value) else "NaN or infinity"
    kinds = ((bool, "true or false"), (int, "an integer"), (str, "a string"), (list, "a list"), (dict, "an object"))
    return next((name for kind, name in kinds if isinstance(value, kind)), type(value).__name__)


def _uid_text(value: Any) -> Any:
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    raise PydanticCustomError("uid_type", "expected a string or an integer, got {kind}", {"kind": _json_type(value)})


def _answer_text(value: Any) -> Any:
    # The reward matches text, so a number's own digits are the answer ("3.50" stays "3.50").
    if isinstance(value, bool):
        raise PydanticCustomError("answer_type", "got true or false, which has no one answer text "
                                                 "(\"yes\"? \"true\"?): write the answer as a string")
    if isinstance(value, SourceNumber) and math.isfinite(value):
        return value.text
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str):
        raise PydanticCustomError("answer_type", "expected a string or a number, got {kind}", {"kind": _json_type(value)})
    return value


class _Meta(BaseModel):
    model_config = ConfigDict(extra="allow")
    file_name: str = Field(min_length=1)
    reference_page: list[StrictInt]


class _Question(BaseModel):
    model_config = ConfigDict(extra="allow")
    uid: Annotated[str, BeforeValidator(_uid_text)]  # one error path ("uid"), not one per union member
    query: str = Field(min_length=1)
    reference_answer: Annotated[str, BeforeValidator(_answer_text), Field(min_length=1)]
    meta_info: Optional[_Meta] = None  # None: an open-domain question, no document known (corpus scope only)


@dataclass
class ConversionReport:
    rows: int = 0
    written: int = 0
    index: Optional[str] = None
    missing_documents: list = field(default_factory=list)   # {question_id, doc_id, where[, file, row] when kept}
    pages_out_of_range: list = field(default_factory=list)  # {question_id, doc_id, pages, num_pages, where}
    missing_pages: list = field(default_factory=list)        # {question_id, doc_id, pages, lacking, where}
    numbering_gaps: list = field(default_factory=list)       # {doc_id, missing, gold_pages}
    dropped: list = field(default_factory=list)              # question ids left out
    validation: int = 0  # of the written rows, those in the validation file
    unanswerable: int = 0  # of the written rows, those a public set marks unanswerable (kept)
    scope: str = "document"  # the search scope the rows were written for

    def to_dict(self) -> dict:
        return {"rows": self.rows, "written": self.written, "validation": self.validation, "scope": self.scope,
                "unanswerable": self.unanswerable, "index": self.index,
                "missing_documents": self.missing_documents,
                "pages_out_of_range": self.pages_out_of_range, "missing_pages": self.missing_pages,
                "numbering_gaps": self.numbering_gaps, "dropped": self.dropped}


EXPECTED_INPUT = ('expected a JSON array of questions, {"data": [...]} or {"examples": [...]} (an object holding '
                  "that array), or JSON Lines (one question object per line)")
WRAPPER_KEYS = ("data", "examples")  # {"examples": [...]} is ViDoSeek's vidoseek.json
QUESTION_KEYS = ("uid", "query", "reference_answer", "meta_info")


_loads = loads  # json_numbers.loads: numbers keep their source text


def _is_wrapper(value: Any) -> bool:
    """`{"data": [questions]}` or `{"examples": [questions]}`: unambiguous, as it holds none of a
    question's keys."""
    return (isinstance(value, dict) and any(isinstance(value.get(key), list) for key in WRAPPER_KEYS)
            and not any(key in value for key in QUESTION_KEYS))


def _wrapped(value: dict) -> list:
    return next(value[key] for key in WRAPPER_KEYS if isinstance(value.get(key), list))


def _one_object(value: dict) -> str:
    if any(key in value for key in QUESTION_KEYS):
        return "the file is one question object spread over several lines"
    keys = ", ".join(repr(key) for key in list(value)[:8]) + (", ..." if len(value) > 8 else "")
    return f"the file is one JSON object (keys {keys or 'none'}), not a list of questions"


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    text = question_text(path)  # a clear message for a PDF, a parquet file or non-UTF-8 bytes
    lines = text.splitlines()
    first = next((number for number, line in enumerate(lines, start=1) if line.strip()), 1)
    start = text.lstrip()[:1]
    whole: Any = None
    if start in ("[", "{"):
        try:
            whole = _loads(text)
        except json.JSONDecodeError as error:
            if start == "[":
                raise DatasetError(f"line {error.lineno}", "<json>", f"not valid JSON: {error.msg}") from None
            # "{" and not one JSON value: JSON Lines, read below line by line
    if isinstance(whole, list) or _is_wrapper(whole):
        for number, item in enumerate(whole if isinstance(whole, list) else _wrapped(whole), start=1):
            yield f"item {number}", item
        return
    # One object that is no question (no question key at all), or a question on several lines
    # (JSON Lines needs one per line); a one-line question is JSON Lines of one row.
    if isinstance(whole, dict) and (not any(key in whole for key in QUESTION_KEYS)
                                    or sum(1 for line in lines if line.strip()) > 1):
        raise DatasetError(f"line {first}", "<json>",
                           f"{_one_object(whole)}: {EXPECTED_INPUT}{layout_hint(whole, 'vidoseek')}")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield f"line {number}", _loads(line)
        except json.JSONDecodeError as error:
            # a first line that is not JSON is most likely another layout, not a typo
            hint = f" ({EXPECTED_INPUT})" if number == first else ""
            raise DatasetError(f"line {number}", "<json>", f"not valid JSON: {error.msg}{hint}") from None


# pydantic's error types, worded as the public sets' readers word theirs (`sources`), so that one
# problem reads the same in every layout; {kind} is the JSON type the row has there.
_WORDING = {
    "missing": MISSING,
    "string_type": "expected a non-empty string, got {kind}",
    "string_too_short": "expected a non-empty string, got an empty string",
    "too_short": "expected a non-empty string or a number, got an empty string",  # the answer, after its validator
    "model_type": "expected a JSON object, got {kind}",
    "dict_type": "expected a JSON object, got {kind}",
    "list_type": "expected a list of page numbers, got {kind}",
    "int_type": "expected an integer page number, got {kind}",
}


def _field_message(error: dict) -> str:
    """One pydantic error in this project's wording (its own message for a type not in `_WORDING`)."""
    wording = _WORDING.get(error["type"])
    return wording.format(kind=_json_type(error.get("input"))) if wording else error["msg"]


def _question(where: str, record: Any, page_base: int) -> _Question:
    """The VRAG-layout question of a row; `DatasetError` naming the first bad field, and, for a row
    of another layout, the `--from` that reads it."""
    if not isinstance(record, dict):
        raise DatasetError(where, "<row>", f"expected a JSON object, got {_json_type(record)}")
    try:
        question = _Question.model_validate(record)
    except ValidationError as error:
        first = error.errors()[0]
        path = ".".join(str(part) for part in first["loc"]) or "<row>"
        message = _field_message(first)
        raise DatasetError(where, path, message + layout_hint(record, "vidoseek", message)) from None
    for position, page in enumerate(question.meta_info.reference_page if question.meta_info is not None else ()):
        if page < page_base:
            hint = " (a 0-based source? convert it with --page-base 0)" if page_base == 1 else ""
            raise DatasetError(where, f"meta_info.reference_page.{position}",
                               f"page {page} is below the first page number {page_base}{hint}")
    return question


def _source_of(question: _Question) -> Optional[dict]:
    """A `sources` reader's note on where the record came from (None for the VRAG layout)."""
    return (question.model_extra or {}).get("_source")


def _pages_past_end(where: str, question: _Question, doc_id: str, num_pages: int, page_base: int,
                    drop: bool) -> Optional[dict]:
    """The report entry of a question whose gold pages pass its document's end (None if none);
    raises `DatasetError` for it unless `drop`: a wrong gold page would train silently."""
    past = [(position, page) for position, page in enumerate(question.meta_info.reference_page)
            if page - page_base + 1 > num_pages]
    if not past:
        return None
    if not drop:
        position, page = past[0]
        # a set's record (pages counted from 1) names the set's own field and page number
        source = _source_of(question)
        field_path, shown_base = ((source["page_field"], source["page_base"]) if source is not None
                                  else ("meta_info.reference_page", page_base))
        shown = page - page_base + shown_base
        counted = f" (page {page - page_base + 1} counted from 1)" if shown_base != 1 else ""
        raise DatasetError(where, f"{field_path}.{position}",
                           f"page {shown}{counted} is past the end of document {doc_id!r}, which has {num_pages} "
                           f"pages in the index; fix the page, or leave such questions out with --drop-missing")
    pages = sorted({page - page_base + 1 for page in question.meta_info.reference_page})
    return {"question_id": str(question.uid), "doc_id": doc_id, "pages": pages, "num_pages": num_pages,
            "where": where}


SHOWN_NUMBERS = 10  # missing image numbers named per document in messages
LISTED_NUMBERS = 100  # missing image numbers listed per document in the report (the smallest)
# What a set calls its pages and documents, and why one may lack an image, in messages about
# missing page images.
_WORDS = {"slidevqa": ("slide", "deck", "; SlideVQA's download skips slides that fail with 404")}


def _shown(numbers: list) -> str:
    return ", ".join(map(str, numbers[:SHOWN_NUMBERS])) + (", ..." if len(numbers) > SHOWN_NUMBERS else "")


def _pages_by_number(where: str, question: _Question, source: dict, doc_id: str, numbers: list,
                     drop: bool) -> tuple[Optional[list], Optional[dict]]:
    """Gold pages written as the numbers of a document's page images (`source["pages_are_numbers"]`),
    as the positions the retriever serves those images at: `(pages, None)`. A number no image of
    the document carries is never written: `DatasetError` naming the document and the numbers it
    lacks, or with `drop`, `(None, its report entry)`. `numbers`: each page's own number, page 1
    first (`Manifest.source_numbers`); the set's pages are read in its own numbering."""
    from retriever_server.storage.manifest import missing_numbers

    position = {number: k for k, number in enumerate(numbers, start=1)}
    own = [page - 1 + source["page_base"] for page in question.meta_info.reference_page]
    absent = [(i, number) for i, number in enumerate(own) if number not in position]
    if not absent:
        return sorted({position[number] for number in own}), None
    lacking = sorted(set(missing_numbers(numbers, LISTED_NUMBERS)) | {number for _, number in absent})
    if drop:
        return None, {"question_id": str(question.uid), "doc_id": doc_id,
                      "pages": sorted({number for _, number in absent}), "lacking": lacking, "where": where}
    item, document, why = _WORDS.get(source["set"], ("page", "document", ""))
    position_in_row, number = absent[0]
    raise DatasetError(where, f"{source['page_field']}.{position_in_row}",
                       f"{item} {number} of {document} {doc_id!r} is not in the index: its folder has no image "
                       f"numbered {number} (the {document} lacks {item}s {_shown(lacking)}{why}). Add the missing "
                       f"images and re-index, or leave such questions out with --drop-missing")


def _note_gaps(report: ConversionReport, doc_id: str, numbers: Optional[list], mapped: bool) -> None:
    """List a document's numbering gaps (the smallest `LISTED_NUMBERS`) in the report, once per document."""
    from retriever_server.storage.manifest import missing_numbers

    if numbers is None or any(gap["doc_id"] == doc_id for gap in report.numbering_gaps):
        return
    missing = missing_numbers(numbers, LISTED_NUMBERS)
    if missing:
        report.numbering_gaps.append({"doc_id": doc_id, "missing": missing,
                                      "gold_pages": "mapped by image number" if mapped else "read as positions"})


QUESTION_MARK = "\nQuestion: "  # where `make_prompt` joins the instructions and the question


def make_prompt(query: str, instructions: str = AGENT_INSTRUCTIONS) -> str:
    return f"{instructions}{QUESTION_MARK}{query}"


def _set_records(source_format: str, path: Path) -> Iterator[tuple[str, Any]]:
    """A public set's rows through its `sources` reader, its errors as `DatasetError`."""
    from . import sources

    try:
        yield from sources.read_source(source_format, path)
    except sources.SourceError as error:
        raise DatasetError(error.where, error.field, error.message) from None


def default_scope(source_format: Optional[str]) -> str:
    """The search scope a set is converted for unless `--scope` says: the set's own protocol."""
    return DEFAULT_SCOPES.get(source_format, "document")


def convert_rows(path: Path, *, page_base: int = 1, documents: Optional[dict] = None,
                 drop_missing: bool = False, report: Optional[ConversionReport] = None,
                 action_format: str = "tags", source_format: Optional[str] = None, region_action: bool = False,
                 source_numbers: Optional[dict] = None, scope: Optional[str] = None) -> dict:
    """Column lists for the parquet; `documents` ({doc_id: num_pages}) enables the index report,
    `source_numbers` ({doc_id: each page's own image number, page 1 first}, for the index's
    numbered image folders) the mapping of gold pages written as those numbers; `source_format`
    names the input's layout (None: your own questions in the VRAG layout) and `scope` the
    search scope (None: `default_scope`; see the module docstring)."""
    scope = scope or default_scope(source_format)
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    named_set = source_format  # a public set named: its rows carry what its scoring reads (EVAL)
    source_format = source_format or "vidoseek"
    if page_base not in (0, 1):
        raise ValueError(f"page_base must be 0 or 1, got {page_base}")
    if action_format not in FORMATS:
        raise ValueError(f"action_format must be one of {sorted(FORMATS)}, got {action_format!r}")
    if source_format not in SOURCE_FORMATS:
        raise ValueError(f"source_format must be one of {', '.join(SOURCE_FORMATS)}, got {source_format!r}")
    from_set = source_format != "vidoseek"
    if from_set and page_base != 1:
        raise ValueError(f"page_base is for the vidoseek layout only: {source_format}'s pages are read in that "
                         "set's own numbering")
    report = report if report is not None else ConversionReport()
    columns: dict = {name: [] for name in COLUMNS + ((PAGE_COUNT,) if documents is not None else ())
                     + ((EVAL,) if named_set is not None else ())}
    seen: dict = {}
    for where, record in (_set_records(source_format, path) if from_set else _records(path)):
        question = _question(where, record, page_base)
        source = _source_of(question) if from_set else None
        qid = str(question.uid)
        if qid in seen:
            raise DatasetError(where, source["id_field"] if source else "uid",
                               f"duplicate {'question id' if source else 'uid'} {qid!r} (first at {seen[qid]})")
        seen[qid] = where
        report.rows += 1
        if source is None and question.meta_info is None:
            if scope != "corpus":
                raise DatasetError(where, "meta_info", "missing: a question with no document of its own converts "
                                                       "with --scope corpus only (it searches the whole index; no "
                                                       "gold page, so its retrieval is not scored)")
            doc_id, pages = None, []
        else:
            doc_id = source["doc_id"] if source else Path(question.meta_info.file_name).stem
            pages = sorted({page - page_base + 1 for page in question.meta_info.reference_page})
        if documents is not None and doc_id is not None:
            if doc_id not in documents:
                report.missing_documents.append({"question_id": qid, "doc_id": doc_id, "where": where})
                if drop_missing:
                    report.dropped.append(qid)
                    continue
            else:
                numbers = (source_numbers or {}).get(doc_id)
                by_number = numbers is not None and bool(source and source.get("pages_are_numbers"))
                _note_gaps(report, doc_id, numbers, by_number)
                if by_number:
                    mapped, lacking = _pages_by_number(where, question, source, doc_id, numbers, drop_missing)
                    if lacking is not None:
                        report.missing_pages.append(lacking)
                        report.dropped.append(qid)
                        continue
                    pages = mapped
                else:
                    past = _pages_past_end(where, question, doc_id, documents[doc_id], page_base, drop_missing)
                    if past is not None:
                        report.pages_out_of_range.append(past)
                        report.dropped.append(qid)
                        continue
        if scope == "corpus":  # no document to search: gold pages name theirs
            gold: list = [[doc_id, page] for page in pages]
            truth = {"answer": question.reference_answer, "doc_id": None, "gold_pages": gold}
        else:
            gold = pages
            truth = {"answer": question.reference_answer, "doc_id": doc_id, "gold_pages": gold}
        if source is not None:
            truth["answerable"] = bool(question.model_extra["answerable"])
            report.unanswerable += not truth["answerable"]
        columns["prompt"].append(make_prompt(question.query, instructions_for(action_format, region_action, scope)))
        columns["answer"].append(json.dumps(truth, ensure_ascii=False))
        columns["doc_id"].append(doc_id if scope == "document" else None)
        columns["gold_pages"].append(json.dumps(gold, ensure_ascii=False))
        columns["question_id"].append(qid)
        if named_set is not None:
            columns[EVAL].append(json.dumps({"set": named_set, "document": doc_id,
                                             **evaluation_fields(question, source)}, ensure_ascii=False))
        if documents is not None:  # a corpus row has no document of its own to count
            columns[PAGE_COUNT].append(documents.get(doc_id) if scope == "document" else None)
        report.written += 1
    if not report.rows:
        raise DatasetError("file", "<questions>", f"no questions in it, nothing to write ({EXPECTED_INPUT})")
    if not report.written:
        raise DatasetError("file", "<questions>", f"no questions left: all {report.rows} dropped "
                                                  "(their documents or gold pages are not in the index)")
    return columns


def evaluation_fields(question: _Question, source: Optional[dict]) -> dict:
    """The answer format and the set's categories of a question (`sources`' `_eval`; ViDoSeek's
    from its `meta_info`)."""
    from .sources import vidoseek_categories

    if source is not None:
        return dict((question.model_extra or {}).get("_eval") or {"answer_format": None, "categories": {}})
    extra = question.meta_info.model_extra if question.meta_info is not None else None
    return {"answer_format": None, "categories": vidoseek_categories(extra or {})}


def index_documents(index_dir: Path) -> dict:
    """{doc_id: num_pages} of a retriever index, through its public manifest reader; raises
    `IndexDirError` saying what is wrong with a path that is not a readable index."""
    return {doc.doc_id: doc.num_pages for doc in index_manifest(index_dir).docs}


def index_manifest(index_dir: Path):
    """The manifest (`retriever_server.storage.manifest.Manifest`) of a retriever index; raises
    `IndexDirError` saying what is wrong with a path that is not a readable index."""
    from retriever_server.storage.manifest import MANIFEST_NAME, read_manifest

    index_dir = Path(index_dir)
    problem = no_index_at(index_dir)
    if problem is not None:
        raise IndexDirError(index_dir, problem)
    try:
        manifest = read_manifest(index_dir)
    except (OSError, ValueError) as error:
        raise IndexDirError(index_dir, f"unreadable {MANIFEST_NAME}: {error}") from error
    return manifest


def convert_dataset(source: Path, out: Path, *, index_dir: Optional[Path] = None, page_base: int = 1,
                    drop_missing: bool = False, action_format: str = "tags", val_out: Optional[Path] = None,
                    val_fraction: float = 0.0, split_of: str = "question", layout: str = "easyr1",
                    data_source: str = "vrag", source_format: Optional[str] = None,
                    region_action: bool = False, scope: Optional[str] = None) -> ConversionReport:
    """Write `out` (parquet), and `val_out` with `val_fraction` of the rows, from `source` (in the
    `source_format` layout); returns the report (see the module docstring)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if drop_missing and index_dir is None:
        raise ValueError("drop_missing needs an index to check documents against")
    if (val_out is None) != (val_fraction == 0):
        raise ValueError("a validation split needs both val_out and a val_fraction above 0")
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if split_of not in SPLIT_KEYS:
        raise ValueError(f"split_of must be one of {sorted(SPLIT_KEYS)}, got {split_of!r}")
    report = ConversionReport(index=str(index_dir) if index_dir is not None else None,
                              scope=scope or default_scope(source_format))
    manifest = index_manifest(index_dir) if index_dir is not None else None
    documents = {doc.doc_id: doc.num_pages for doc in manifest.docs} if manifest is not None else None
    columns = convert_rows(Path(source), page_base=page_base, documents=documents,
                           drop_missing=drop_missing, report=report, action_format=action_format,
                           source_format=source_format, region_action=region_action, scope=scope,
                           source_numbers=manifest.source_numbers() if manifest is not None else None)
    write = write_easyr1 if layout == "easyr1" else (lambda cols, path: write_verl(cols, path, data_source))
    if val_out is None:
        write(columns, Path(out))
        _locate_kept(report, {Path(out): columns["question_id"]})
        return report
    to_val = [in_validation(key, val_fraction) for key in split_keys(columns, split_of)]
    train, val = rows_where(columns, [not v for v in to_val]), rows_where(columns, to_val)
    if not train["prompt"] or not val["prompt"]:
        raise DatasetError("file", "<questions>", f"a {val_fraction:g} split by {split_of} of {report.written} "
                                                  f"questions leaves {'no training' if not train['prompt'] else 'no validation'} "
                                                  "rows; change val_fraction or split_of")
    write(train, Path(out))
    write(val, Path(val_out))
    report.validation = len(val["prompt"])
    _locate_kept(report, {Path(out): train["question_id"], Path(val_out): val["question_id"]})
    return report


def _locate_kept(report: ConversionReport, written: dict) -> None:
    """Note in each kept question whose document the index lacks the file it was written to
    (`file`) and its row there (`row`, counted from 1): where training will fail on it.
    `written`: {parquet path: the question ids of its rows, in order}."""
    rows = {qid: (str(path), number) for path, ids in written.items() for number, qid in enumerate(ids, start=1)}
    for item in report.missing_documents:
        if item["question_id"] in rows:
            item["file"], item["row"] = rows[item["question_id"]]
