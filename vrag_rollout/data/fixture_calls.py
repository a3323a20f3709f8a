"""Record the retriever calls a converted dataset's questions can make, for replay tests
(`vrag-rollout record-fixtures --data train.parquet --index my_index [--queries FILE]`).

A rollout searches and fetches in its question's document (the parquet's `doc_id`). The calls
listed (`dataset_retrieval_calls`, pure):
- fetches: every page of every dataset document, as an image and as text: `(doc_id, "image, 3")`;
  page counts come from the index manifest (`index_dir`) or, without one, the live retriever's
  GET /documents;
- searches: the policy writes its own queries, so only those of an optional queries file
  (UTF-8, one query per line, blank lines skipped) are recorded, each in every dataset document,
  at `top_n` (a recorded search is keyed by (doc_id, query, top_n): use the replaying run's top_n).
Replaying any other call misses (`FixtureMiss`, strict replay). A dataset document the retriever
does not serve is refused (ValueError naming it): its calls could only record errors.

Recording reuses `vrag_rollout.retrieval.fixtures.record_fixtures` (the file format is documented
there), against `retriever_url`, or the index served on loopback for the recording.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Iterable, Optional, Sequence

from ..config import AgentRolloutConfig
from .dataset import DatasetError, IndexDirError, index_documents

DEFAULT_TOP_N = AgentRolloutConfig.top_n
FETCH_MODES = ("image", "text")


def dataset_doc_ids(path: Path) -> list[str]:
    """The distinct documents of a parquet `convert-dataset` wrote, sorted."""
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except (OSError, ValueError) as error:  # missing, or not parquet (pyarrow's ArrowInvalid is a ValueError)
        raise DatasetError(str(path), "<file>", f"not a readable parquet file ({error})") from error
    if "doc_id" not in names:
        raise DatasetError(str(path), "doc_id", "no such column: not a converted dataset "
                           "(write one with `vrag-rollout convert-dataset`)")
    doc_ids = sorted({str(doc) for doc in pq.read_table(path, columns=["doc_id"]).column("doc_id").to_pylist() if doc})
    if not doc_ids:
        raise DatasetError(str(path), "doc_id", "no questions")
    return doc_ids


def read_queries(path: Path) -> list[str]:
    """The queries of a queries file: one per line, stripped, blank lines skipped, first copy kept."""
    queries = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not queries:
        raise ValueError(f"{path}: no queries (one query per line)")
    return list(dict.fromkeys(queries))


def dataset_retrieval_calls(doc_ids: Iterable[str], page_counts: dict, queries: Sequence[str] = (),
                            modes: Sequence[str] = FETCH_MODES) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """([(doc_id, query)], [(doc_id, "image, 3")]): every query in every document, every page of
    every document in every mode. Raises ValueError naming the documents `page_counts` lacks."""
    doc_ids = sorted(set(doc_ids))
    unknown = [doc for doc in doc_ids if doc not in page_counts]
    if unknown:
        raise ValueError(f"{len(unknown)} dataset document(s) not served by the retriever: "
                         f"{', '.join(map(repr, unknown[:10]))}{', ...' if len(unknown) > 10 else ''} "
                         "(`vrag-rollout convert-dataset QUESTIONS --out OUT --index INDEX --drop-missing` "
                         "leaves their questions out)")
    searches = [(doc, query) for doc in doc_ids for query in queries]
    fetches = [(doc, f"{mode}, {page}") for doc in doc_ids for mode in modes
               for page in range(1, int(page_counts[doc]) + 1)]
    return searches, fetches


def served_page_counts(retriever_url: str, api_key: Optional[str] = None) -> dict:
    """{doc_id: num_pages} from a live retriever's GET /documents."""
    from ..retrieval.client import RetrieverClient

    with RetrieverClient(retriever_url, api_key=api_key, binary=False) as client:
        counts = client.documents()
    if counts is None:
        raise ValueError(f"the retriever at {retriever_url} does not list its documents (GET /documents); "
                         "pass its index directory instead (--index DIR)")
    return counts


def record_dataset_fixtures(data: Path, out: Path, *, queries: Optional[Path] = None,
                            retriever_url: Optional[str] = None, index_dir: Optional[Path] = None,
                            top_n: int = DEFAULT_TOP_N, api_key: Optional[str] = None) -> dict:
    """Record every call of `dataset_retrieval_calls` for the dataset `data` into `out`; serves
    `index_dir` on loopback unless `retriever_url` is given. Returns `record_fixtures`' summary
    plus the number of documents."""
    from ..retrieval.fixtures import record_fixtures

    if retriever_url is None and index_dir is None:
        raise ValueError("record the dataset's calls from a retriever: give its index directory or its URL")
    if top_n < 1:
        raise ValueError(f"top_n must be >= 1, got {top_n}")
    doc_ids = dataset_doc_ids(data)
    query_list = read_queries(queries) if queries is not None else []
    # The manifest is the page count of what is served from it; a bare URL tells its own.
    counts = index_documents(index_dir) if index_dir is not None else served_page_counts(retriever_url, api_key)
    searches, fetches = dataset_retrieval_calls(doc_ids, counts, query_list)
    with ExitStack() as stack:
        if retriever_url is None:
            from retriever_server.api.testing import serve_in_thread

            retriever_url = stack.enter_context(serve_in_thread(index_dir))
        summary = record_fixtures(retriever_url, out, searches=searches, fetches=fetches, top_n=top_n,
                                  api_key=api_key)
    return {"documents": len(doc_ids), **summary}


def record_dataset_command(data: Path, out: Path, *, queries: Optional[Path] = None,
                           retriever_url: Optional[str] = None, index_dir: Optional[Path] = None,
                           top_n: Optional[int] = None) -> int:
    """The CLI (`record-fixtures --data`): record, print the summary; 2 on bad input, naming it."""
    import sys

    from ..retrieval.transport import TransportError

    try:
        summary = record_dataset_fixtures(data, out, queries=queries, retriever_url=retriever_url,
                                          index_dir=index_dir, top_n=DEFAULT_TOP_N if top_n is None else top_n)
    except IndexDirError as error:  # the index is at fault, not the dataset
        print(f"record-fixtures: --index {error}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as error:  # DatasetError included: it names the file
        print(f"record-fixtures: {error}", file=sys.stderr)
        return 2
    except TransportError as error:  # GET /documents got no answer
        print(f"record-fixtures: --retriever-url {retriever_url}: no answer ({error})", file=sys.stderr)
        return 2
    print(summary)
    return 0
