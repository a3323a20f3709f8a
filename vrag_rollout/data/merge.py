"""`convert-dataset FIRST --merge SECOND ...`: several converted sets as one corpus-scope file.

VRAG-RL evaluates every benchmark against one merged corpus: all the sets' documents in one
index, every question searching all of it. Contract: `merge_columns(files, documents)` is pure:
`files` is a list of (origin, rows) with `origin` the source file's {"file", "sha256"} and `rows`
its converted rows (EasyR1 layout, `dataset.convert_dataset`'s columns), `documents` the merged
index's {doc_id: pages}. It returns the merged file's columns, every row in corpus scope:

- `doc_id` None, gold pages as [document, page] pairs, the answer's ground truth the same, and
  the format's default instructions replaced by its corpus ones (instructions of your own stay);
- `question_id` "<file stem>/<id>", so two sets' ids never collide;
- `eval`: the row's set, its own document (`document`: what `evaluate --scope document` and the
  retriever track's document scope search) and its origin (`origin`: the file and its sha256);
  a row of your own questions gets the set `questions`.

Every page keeps its origin: a gold page is (document, page) and each document its set's, listed
in `documents_by_origin`, which `write_merged` writes into the parquet's metadata (`vrag_merge`).
A document the index lacks, or one whose page count a source recorded differently from the
index's (two sets' documents of one name), is refused (`MergeError`) by name.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

from .dataset import QUESTION_MARK
from .writing import EVAL, PAGE_COUNT

OWN_SET = "questions"  # evaluation.scorers.questions.NAME: your own questions


class MergeError(ValueError):
    """The converted files cannot form one corpus with this index."""


def _corpus_instructions(instructions: str) -> str:
    from ..formats import FORMATS

    for fmt in FORMATS.values():
        for region in (False, True):
            if instructions == fmt.instructions_for(region, "document"):
                return fmt.instructions_for(region, "corpus")
    return instructions


def _gold(row: dict, truth: dict) -> list:
    pages = json.loads(row["gold_pages"]) if row.get("gold_pages") else truth.get("gold_pages") or []
    doc = row.get("doc_id") or truth.get("doc_id")
    return [list(page) if isinstance(page, (list, tuple)) else [doc, page] for page in pages]


def merge_columns(files: list[tuple[dict, list[dict]]], documents: dict) -> dict:
    columns: dict = {name: [] for name in ("prompt", "answer", "doc_id", "gold_pages", "question_id", EVAL,
                                           PAGE_COUNT)}
    seen_pages: dict = {}
    for origin, rows in files:
        stem = Path(origin["file"]).stem
        for number, row in enumerate(rows, start=1):
            where = f"{origin['file']}: row {number}"
            truth = json.loads(row["answer"])
            info = json.loads(row[EVAL]) if row.get(EVAL) else {"set": OWN_SET, "answer_format": None,
                                                               "categories": {}}
            gold = _gold(row, truth)
            document = info.get("document") or row.get("doc_id") or (gold[0][0] if gold else None)
            for doc in {doc for doc, _ in gold} | ({document} if document else set()):
                if doc not in documents:
                    raise MergeError(f"{where}: document {doc!r} is not in the merged index; index every set's "
                                     "documents together (vrag-retriever index SET_A_DOCS SET_B_DOCS --out DIR)")
            recorded = row.get(PAGE_COUNT)
            if document and recorded is not None:
                if recorded != documents[document]:
                    raise MergeError(f"{where}: document {document!r} had {recorded} pages when converted, the "
                                     f"merged index's has {documents[document]}: two sets' documents of one name? "
                                     "rename one before indexing")
                seen_pages[document] = recorded
            instructions, mark, question = str(row["prompt"]).partition(QUESTION_MARK)
            prompt = _corpus_instructions(instructions) + mark + question if mark else row["prompt"]
            columns["prompt"].append(prompt)
            columns["answer"].append(json.dumps({**truth, "doc_id": None, "gold_pages": gold}, ensure_ascii=False))
            columns["doc_id"].append(None)
            columns["gold_pages"].append(json.dumps(gold, ensure_ascii=False))
            columns["question_id"].append(f"{stem}/{row['question_id']}")
            columns[EVAL].append(json.dumps({**info, "document": document, "origin": origin}, ensure_ascii=False))
            columns[PAGE_COUNT].append(None)
    return columns


def documents_by_origin(columns: dict) -> dict:
    """{source file: the documents its rows name}: the origin of every gold page."""
    found: dict = {}
    for raw in columns[EVAL]:
        info = json.loads(raw)
        if info.get("document"):
            found.setdefault(info["origin"]["file"], set()).add(info["document"])
    return {origin: sorted(docs) for origin, docs in found.items()}


def _digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_converted(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as error:
        raise MergeError(f"{path}: not a readable parquet file ({error})") from error
    if "reward_model" in table.column_names or not {"prompt", "answer", "question_id"} <= set(table.column_names):
        raise MergeError(f"{path}: not a convert-dataset file in the EasyR1 layout (merge those: convert with "
                         "--layout easyr1, the default)")
    return table.to_pylist()


def write_merged(sources: list[Path], out: Path, index_dir: Path) -> dict:
    """Merge `sources` against the index at `index_dir` into `out`; returns {"rows", "by_origin"}."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .dataset import index_documents

    documents = index_documents(Path(index_dir))
    files = [({"file": Path(path).name, "sha256": _digest(path)}, read_converted(Path(path))) for path in sources]
    if len({origin["file"] for origin, _ in files}) < len(files):
        raise MergeError("two sources share a file name: their question ids would collide; rename one")
    columns = merge_columns(files, documents)
    by_origin = documents_by_origin(columns)
    types = {PAGE_COUNT: pa.int64()}
    table = pa.table({name: pa.array(values, type=types.get(name, pa.string())) for name, values in columns.items()})
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"vrag_merge": json.dumps(
        {"sources": [origin for origin, _ in files], "documents_by_origin": by_origin}).encode()})
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    return {"rows": len(columns["question_id"]), "by_origin": by_origin}


def merge_command(sources: list[Path], out: Path, index_dir: Optional[Path]) -> int:
    """The CLI: one line per origin and 0, or one line and 2."""
    import sys

    from .dataset import IndexDirError

    if index_dir is None:
        print("convert-dataset: --merge needs the merged index (--index DIR): every set's documents indexed together",
              file=sys.stderr)
        return 2
    try:
        done = write_merged(sources, out, index_dir)
    except IndexDirError as error:
        print(f"convert-dataset: --index {error}", file=sys.stderr)
        return 2
    except MergeError as error:
        print(f"convert-dataset (merge): {error}", file=sys.stderr)
        return 2
    print(f"merged {done['rows']} questions from {len(sources)} files into {out} (corpus scope: every question "
          f"searches all of {index_dir})")
    for origin, docs in done["by_origin"].items():
        print(f"  {origin}: documents {', '.join(docs)}")
    return 0
