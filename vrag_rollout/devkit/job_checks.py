"""What the rollout commands (`demo`, `rollout`, `learn`) check before they start an engine.

Contract:

- `JobInputError`: an expected user error (a retriever that is down, a document it lacks, a file
  of the wrong kind or at a wrong path); its message is one line that names the flag to change.
  `vrag-rollout` prints it as one line and exits 2, without a traceback.
- `check_retriever(source, doc_ids, page_counts, mode, hint)`: before any engine starts, whether
  the retriever the job will use (`RetrieverSource`: an index served here, a running server, or
  recorded fixtures) can start at all (`source_problem`: an index or fixture file that is not
  one raises `JobInputError` in every mode), then whether it answers and holds the batch's
  documents with the page counts the data recorded (`retriever_problem`). An index is read
  directly, so a message names the index passed, not the loopback address it is served on; a
  server is asked (`retrieval.preflight`, as the rollout itself asks later). `mode` is the
  `--retriever-preflight` setting for that second check: "fail" raises `JobInputError`, "warn"
  prints the problem and goes on, "off" skips it. `hint` ends a missing-documents message (the
  demo's: its questions are the sample corpus's).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

WARN_ANYWAY = "--retriever-preflight warn goes on anyway"


class JobInputError(ValueError):
    """An expected user error of a rollout command, said in one line."""


@dataclass(frozen=True)
class RetrieverSource:
    """Where a job's retriever calls go: exactly one of an index served by the job, a running
    server's URL, or a fixture file (with a URL too, the fixtures answer)."""

    index: Optional[Path] = None
    url: Optional[str] = None
    fixtures: Optional[Path] = None


def check_retriever(source: RetrieverSource, doc_ids: Sequence[Optional[str]],
                    page_counts: Optional[Sequence[Optional[int]]] = None, mode: str = "fail",
                    hint: str = "") -> None:
    broken = source_problem(source)
    if broken is not None:  # the job cannot start on it, whatever the mode
        raise JobInputError(broken)
    if mode == "off":
        return
    problem = retriever_problem(source, doc_ids, page_counts, hint)
    if problem is None:
        return
    if mode == "fail":
        raise JobInputError(f"{problem} ({WARN_ANYWAY})")
    print(f"warning: retriever preflight: {problem}", file=sys.stderr)


def source_problem(source: RetrieverSource) -> Optional[str]:
    """Why the job could not even start on `source` (an index or a fixture file that is not
    one), or None."""
    if source.fixtures is not None:
        return _fixtures_problem(Path(source.fixtures))
    if source.index is not None:
        from retriever_server.indexing.suggest import no_index_at

        problem = no_index_at(Path(source.index))
        return None if problem is None else f"--index {source.index}: {problem}"
    return None


def retriever_problem(source: RetrieverSource, doc_ids: Sequence[Optional[str]],
                      page_counts: Optional[Sequence[Optional[int]]] = None, hint: str = "") -> Optional[str]:
    """Whether a retriever that can start answers and holds this batch's documents: the one-line
    problem (ending with `hint` when documents are missing), or None. Fixtures cannot list
    their documents: a replay is checked by `source_problem` only."""
    if source.fixtures is not None:
        return None
    if source.index is not None:
        return _index_problem(Path(source.index), doc_ids, page_counts, hint)
    if source.url is not None:
        return _server_problem(source.url, doc_ids, page_counts, hint)
    return None


def _fixtures_problem(path: Path) -> Optional[str]:
    from ..retrieval.fixtures import Fixtures

    if not path.is_file():
        return f"--fixtures {path}: no such file (record one with `vrag-rollout record-fixtures`)"
    try:
        Fixtures.load(path)
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"--fixtures {path}: not a fixture file ({type(error).__name__}: {_first_line(error)})"
    return None


def _index_problem(index: Path, doc_ids: Sequence[Optional[str]],
                   page_counts: Optional[Sequence[Optional[int]]], hint: str) -> Optional[str]:
    from ..data.dataset import IndexDirError, index_documents

    try:
        held = index_documents(index)
    except IndexDirError as error:
        return f"--index {error}"
    fix = f"index them (`vrag-retriever index`), or convert the questions again with " \
          f"`convert-dataset --index {index} --drop-missing`"
    return _documents_problem(f"--index {index}", held, doc_ids, page_counts, fix, hint)


def _server_problem(url: str, doc_ids: Sequence[Optional[str]],
                    page_counts: Optional[Sequence[Optional[int]]], hint: str) -> Optional[str]:
    from ..retrieval.client import RetrieverClient
    from ..retrieval.transport import TransportError

    with RetrieverClient(url, timeout=5.0, retries=1) as client:
        try:
            served = client.documents()
        except TransportError as error:
            return (f"--retriever-url {url}: no answer ({error}): start the retriever "
                    f"(`vrag-retriever serve --index DIR`) or pass the URL of a running one")
    if served is None:  # a server that cannot list its documents: it answered, that is all to check
        return None
    fix = "serve an index that holds them (`vrag-retriever index`, then `vrag-retriever serve --index DIR`)"
    return _documents_problem(f"--retriever-url {url}", served, doc_ids, page_counts, fix, hint)


def _documents_problem(where: str, held: dict, doc_ids: Sequence[Optional[str]],
                       page_counts: Optional[Sequence[Optional[int]]], fix: str, hint: str) -> Optional[str]:
    """Documents of the batch that `held` ({doc_id: pages}) lacks, or holds with other page
    counts than the data recorded."""
    from ..retrieval.preflight import missing_documents, page_count_problem, recorded_page_counts

    missing = missing_documents(held, doc_ids)
    if missing:
        return _with_hint(f"{where} does not hold {len(missing)} document(s) of this batch: {_named(missing)} "
                          f"(it holds {len(held)}): {fix}", hint)
    return page_count_problem(where, recorded_page_counts(list(doc_ids), page_counts), held)


def _with_hint(problem: str, hint: str) -> str:
    return f"{problem}; {hint}" if hint else problem


def _named(docs: list, shown: int = 5) -> str:
    return ", ".join(docs[:shown]) + (f" and {len(docs) - shown} more" if len(docs) > shown else "")


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [""])[0]


__all__ = ["JobInputError", "RetrieverSource", "check_retriever", "retriever_problem",
           "source_problem"]
