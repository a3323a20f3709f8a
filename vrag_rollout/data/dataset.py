"""VRAG-style document-QA JSON -> the EasyR1 trainer's parquet (`vrag-rollout convert-dataset`).

Input: a JSON array of questions, or JSON Lines (one question per line), each

    {"uid": "q1", "query": "...", "reference_answer": "...",
     "meta_info": {"file_name": "report.pdf", "reference_page": [3, 5], ...}}

(other keys are allowed and ignored). `reference_page` numbers are 1-based unless
`page_base=0` says the source counts from 0; they are written 1-based, like the retriever's
page ids. The document id is the file name's stem, the rule `vrag-retriever index` uses.

Output columns (one row per question, in input order; no list columns, because EasyR1's
collate turns equal-length lists into a 2-D object array):
- `prompt`: the agent's instructions for the action format (`vrag_rollout.data.prompts.AGENT_INSTRUCTIONS`
  for tags, `TOOL_CALL_INSTRUCTIONS` for tool_call) and the question, as the rollout's demo
  prompts are written (EasyR1 builds a single user turn from it; in a tool_call run the
  integration adds the tool schemas to the system turn);
- `answer`: a JSON object `{"answer", "doc_id", "gold_pages"}`, EasyR1's `ground_truth`, read by
  `vrag_rollout.core.reward`;
- `doc_id`: the document the rollout searches;
- `gold_pages`: the gold pages as a JSON list (for reading; the reward uses `answer`);
- `question_id`: the input's `uid` as a string (EasyR1 sets its own `uid` column per batch).

A malformed row raises `DatasetError` naming its line (JSON Lines) or item (array) and the field.
Nothing is dropped silently: questions whose document is not in a given retriever index are
listed in the report and kept, unless `drop_missing` asks to leave them out (then they are
reported as dropped).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from .prompts import AGENT_INSTRUCTIONS, TOOL_CALL_INSTRUCTIONS

INSTRUCTIONS = {"tags": AGENT_INSTRUCTIONS, "tool_call": TOOL_CALL_INSTRUCTIONS}

COLUMNS = ("prompt", "answer", "doc_id", "gold_pages", "question_id")


class DatasetError(ValueError):
    """A malformed input row: `where` is 'line N' or 'item N', `field` the dotted field path."""

    def __init__(self, where: str, field_path: str, message: str):
        super().__init__(f"{where}: field {field_path!r}: {message}")
        self.where, self.field, self.message = where, field_path, message


class _Meta(BaseModel):
    model_config = ConfigDict(extra="allow")
    file_name: str = Field(min_length=1)
    reference_page: list[StrictInt]


class _Question(BaseModel):
    model_config = ConfigDict(extra="allow")
    uid: Union[str, StrictInt]
    query: str = Field(min_length=1)
    reference_answer: str = Field(min_length=1)
    meta_info: _Meta


@dataclass
class ConversionReport:
    rows: int = 0
    written: int = 0
    index: Optional[str] = None
    missing_documents: list = field(default_factory=list)   # {question_id, doc_id, where}
    pages_out_of_range: list = field(default_factory=list)  # {question_id, doc_id, pages, num_pages}
    dropped: list = field(default_factory=list)              # question ids left out

    def to_dict(self) -> dict:
        return {"rows": self.rows, "written": self.written, "index": self.index,
                "missing_documents": self.missing_documents,
                "pages_out_of_range": self.pages_out_of_range, "dropped": self.dropped}


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as error:
            raise DatasetError(f"line {error.lineno}", "<json>", f"not valid JSON: {error.msg}") from None
        for number, item in enumerate(items, start=1):
            yield f"item {number}", item
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"line {number}", json.loads(line)
        except json.JSONDecodeError as error:
            raise DatasetError(f"line {number}", "<json>", f"not valid JSON: {error.msg}") from None


def _question(where: str, record: Any, page_base: int) -> _Question:
    if not isinstance(record, dict):
        raise DatasetError(where, "<row>", f"expected a JSON object, got {type(record).__name__}")
    try:
        question = _Question.model_validate(record)
    except ValidationError as error:
        first = error.errors()[0]
        path = ".".join(str(part) for part in first["loc"]) or "<row>"
        raise DatasetError(where, path, first["msg"]) from None
    for position, page in enumerate(question.meta_info.reference_page):
        if page < page_base:
            raise DatasetError(where, f"meta_info.reference_page.{position}",
                               f"page {page} is below the first page number {page_base}")
    return question


QUESTION_MARK = "\nQuestion: "  # where `make_prompt` joins the instructions and the question


def make_prompt(query: str, instructions: str = AGENT_INSTRUCTIONS) -> str:
    return f"{instructions}{QUESTION_MARK}{query}"


def convert_rows(path: Path, *, page_base: int = 1, documents: Optional[dict] = None,
                 drop_missing: bool = False, report: Optional[ConversionReport] = None,
                 action_format: str = "tags") -> dict:
    """Column lists for the parquet; `documents` ({doc_id: num_pages}) enables the index report."""
    if page_base not in (0, 1):
        raise ValueError(f"page_base must be 0 or 1, got {page_base}")
    if action_format not in INSTRUCTIONS:
        raise ValueError(f"action_format must be one of {sorted(INSTRUCTIONS)}, got {action_format!r}")
    report = report if report is not None else ConversionReport()
    columns: dict = {name: [] for name in COLUMNS}
    seen: dict = {}
    for where, record in _records(path):
        question = _question(where, record, page_base)
        qid = str(question.uid)
        if qid in seen:
            raise DatasetError(where, "uid", f"duplicate uid {qid!r} (first at {seen[qid]})")
        seen[qid] = where
        report.rows += 1
        doc_id = Path(question.meta_info.file_name).stem
        pages = sorted({page - page_base + 1 for page in question.meta_info.reference_page})
        if documents is not None:
            if doc_id not in documents:
                report.missing_documents.append({"question_id": qid, "doc_id": doc_id, "where": where})
                if drop_missing:
                    report.dropped.append(qid)
                    continue
            elif any(page > documents[doc_id] for page in pages):
                report.pages_out_of_range.append({"question_id": qid, "doc_id": doc_id, "pages": pages,
                                                  "num_pages": documents[doc_id]})
        truth = {"answer": question.reference_answer, "doc_id": doc_id, "gold_pages": pages}
        columns["prompt"].append(make_prompt(question.query, INSTRUCTIONS[action_format]))
        columns["answer"].append(json.dumps(truth, ensure_ascii=False))
        columns["doc_id"].append(doc_id)
        columns["gold_pages"].append(json.dumps(pages))
        columns["question_id"].append(qid)
        report.written += 1
    return columns


def index_documents(index_dir: Path) -> dict:
    """{doc_id: num_pages} of a retriever index, through its public manifest reader."""
    from retriever_server.manifest import read_manifest

    return {doc.doc_id: doc.num_pages for doc in read_manifest(Path(index_dir)).docs}


def convert_dataset(source: Path, out: Path, *, index_dir: Optional[Path] = None, page_base: int = 1,
                    drop_missing: bool = False, action_format: str = "tags") -> ConversionReport:
    """Write `out` (parquet) from `source`; returns the report (see the module docstring)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if drop_missing and index_dir is None:
        raise ValueError("drop_missing needs an index to check documents against")
    report = ConversionReport(index=str(index_dir) if index_dir is not None else None)
    documents = index_documents(index_dir) if index_dir is not None else None
    columns = convert_rows(Path(source), page_base=page_base, documents=documents,
                           drop_missing=drop_missing, report=report, action_format=action_format)
    table = pa.table({name: pa.array(values, type=pa.string()) for name, values in columns.items()})
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    return report


def read_questions(path: Path, limit: Optional[int] = None) -> tuple[list, list[dict]]:
    """The first `limit` rows of a parquet `convert_dataset` wrote, as prompt samples (instructions
    and question split back apart, `doc_id`) and their ground truths (the `answer` JSON)."""
    import pyarrow.parquet as pq

    from .prompts import PromptSample

    table = pq.read_table(path)
    missing = {"prompt", "answer", "doc_id"} - set(table.column_names)
    if missing:
        raise DatasetError(str(path), ",".join(sorted(missing)), "no such column: not a converted dataset "
                           "(write one with `vrag-rollout convert-dataset`)")
    rows = table.slice(0, limit).to_pylist() if limit is not None else table.to_pylist()
    samples, truths = [], []
    for number, row in enumerate(rows, start=1):
        # the first mark ends the instructions (a question may hold the mark itself)
        instructions, mark, question = str(row["prompt"]).partition(QUESTION_MARK)
        if not mark:
            raise DatasetError(f"{path}: row {number}", "prompt", f"no {QUESTION_MARK.strip()!r} line")
        try:
            truth = json.loads(row["answer"])
        except (TypeError, ValueError) as error:
            raise DatasetError(f"{path}: row {number}", "answer", f"not JSON ({error})") from error
        samples.append(PromptSample(question=question, doc_id=row["doc_id"], instructions=instructions))
        truths.append(truth)
    if not samples:
        raise DatasetError(str(path), "prompt", "no questions")
    return samples, truths


def convert_dataset_command(source: Path, out: Path, *, index_dir: Optional[Path] = None,
                            report_path: Optional[Path] = None, page_base: int = 1,
                            drop_missing: bool = False, action_format: str = "tags") -> int:
    """The CLI: convert, print a summary (and the report as JSON with `report_path`); 2 on bad input."""
    import sys

    try:
        report = convert_dataset(source, out, index_dir=index_dir, page_base=page_base, drop_missing=drop_missing,
                                 action_format=action_format)
    except (DatasetError, FileNotFoundError, ValueError) as error:
        print(f"convert-dataset: {source}: {error}", file=sys.stderr)
        return 2
    if report_path is not None:
        Path(report_path).write_text(json.dumps(report.to_dict(), indent=1, ensure_ascii=False), encoding="utf-8")
    print(f"wrote {report.written} of {report.rows} questions to {out}")
    if report.index is not None:
        print(f"{len(report.missing_documents)} questions name a document not in {report.index}"
              + (f" ({len(report.dropped)} dropped)" if report.dropped else " (kept)"))
        for item in report.missing_documents:
            print(f"  missing: {item['where']}: question {item['question_id']}: document {item['doc_id']!r}")
        for item in report.pages_out_of_range:
            print(f"  pages out of range: question {item['question_id']}: {item['doc_id']!r} has "
                  f"{item['num_pages']} pages, gold {item['pages']}")
    return 0
