"""Before a rollout: is the retriever there, and does it serve the batch's documents?

Contract:

- `preflight_problem(client, doc_ids, known, page_counts=None)` returns None when the retriever
  answers and serves every document of `doc_ids` (None entries, samples without a document, are
  skipped) with the page counts the data recorded (`page_counts`, aligned with `doc_ids`, None
  where none was recorded), else one message that names the fix. `known` ({doc_id: page count})
  caches the documents already confirmed, so a later batch asks the retriever only about
  documents it has not seen (the listing is fetched again then: an index may have been reloaded
  with new documents), and its recorded counts are compared with the cached ones.
- A retriever that cannot list its documents (recorded fixtures; a server without
  `GET /documents`) is checked for reachability only; a retriever object without a `documents`
  method (the caller's own) is not checked.
- `enforce(problem, mode, logger)`: mode "fail" raises `RetrieverPreflightError`, "warn" logs the
  message as a warning, "off" does nothing (the rollout does not even call the check then).
- `failure_rate_warning(metrics, threshold)`: the warning for a batch whose retriever calls failed
  more often than `threshold` (a fraction), or None.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping, Optional, Sequence

from .transport import TransportError

SHOWN = 5  # document ids named in a message; the rest are counted


class RetrieverPreflightError(RuntimeError):
    """The retriever cannot serve this batch: unreachable, or without some of its documents."""


def _where(client: Any) -> str:
    """'the retriever at URL[, URL...]', or 'the retriever' for one without URLs (a replay)."""
    urls = [str(u) for u in (getattr(client, "urls", None) or [getattr(client, "url", None)]) if u]
    return "the retriever" + (f" at {', '.join(urls)}" if urls else "")


def missing_documents(served: Mapping[str, int], wanted: Iterable[Optional[str]]) -> list[str]:
    """The distinct documents of `wanted` that `served` lacks, in first-seen order."""
    return list(dict.fromkeys(doc for doc in wanted if doc is not None and doc not in served))


def preflight_problem(client: Any, doc_ids: Iterable[Optional[str]], known: dict,
                      page_counts: Optional[Sequence[Optional[int]]] = None) -> Optional[str]:
    doc_ids = list(doc_ids)
    recorded = recorded_page_counts(doc_ids, page_counts)
    where = _where(client)
    problem = _serving_problem(client, where, doc_ids, known)
    if problem is None:
        problem = page_count_problem(where, recorded, known)
    return problem


def page_count_value(value: Any) -> Optional[int]:
    """A dataset cell's page count: None for no count (None, or NaN as pandas reads a null)."""
    return None if value is None or value != value else int(value)


def recorded_page_counts(doc_ids: Sequence[Optional[str]],
                         page_counts: Optional[Sequence[Optional[int]]]) -> dict:
    """{doc_id: the counts the batch recorded for it} (a set: two rows may disagree)."""
    recorded: dict = {}
    for doc, count in zip(doc_ids, page_counts or ()):
        if doc is not None and count is not None:
            recorded.setdefault(doc, set()).add(int(count))
    return recorded


def page_count_problem(where: str, recorded: Mapping[str, set], served: Mapping[str, Optional[int]]) -> Optional[str]:
    """The message for documents whose served page count differs from the one the data recorded
    (documents the retriever could not count are skipped), or None."""
    wrong = [(doc, sorted(counts), served[doc]) for doc, counts in recorded.items()
             if served.get(doc) is not None and counts != {served[doc]}]
    if not wrong:
        return None
    named = ", ".join(f"{doc} ({'/'.join(map(str, counts))} in the data, {pages} served)"
                      for doc, counts, pages in wrong[:SHOWN])
    more = f" and {len(wrong) - SHOWN} more" if len(wrong) > SHOWN else ""
    return (f"{where} serves {len(wrong)} document(s) of this batch with other page counts than the data "
            f"recorded: {named}{more}: the data was converted against another index (or another version of "
            f"the documents); serve the index it was converted with, or convert it again with "
            f"`vrag-rollout convert-dataset --index` on the served one")


def _serving_problem(client: Any, where: str, doc_ids: Sequence[Optional[str]], known: dict) -> Optional[str]:
    wanted = [doc for doc in dict.fromkeys(doc_ids) if doc is not None and doc not in known]
    if not wanted and known:
        return None
    lister = getattr(client, "documents", None)
    if lister is None:  # a retriever object of the caller's own that cannot list: trust it
        return None
    try:
        served = lister()
    except TransportError as error:
        return (f"{where} is unreachable ({error}): start it (`vrag-retriever serve --index DIR`) "
                f"or point retriever_url at a running one")
    if served is None:  # cannot list: reachability was all there was to check
        known.update(dict.fromkeys(wanted))
        return None
    missing = missing_documents(served, wanted)
    known.update({doc: served[doc] for doc in wanted if doc in served})
    if not missing:
        return None
    named = ", ".join(missing[:SHOWN]) + (f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else "")
    return (f"{where} does not serve {len(missing)} document(s) of this batch: {named} "
            f"(it serves {len(served)}): index them (`vrag-retriever index`), serve the index that has them, "
            f"or fix the dataset's doc_id column")


def enforce(problem: Optional[str], mode: str, logger: logging.Logger) -> None:
    if problem is None or mode == "off":
        return
    if mode == "fail":
        raise RetrieverPreflightError(problem + " (retriever_preflight='warn' goes on anyway)")
    logger.warning("retriever preflight: %s", problem)


def failure_rate_warning(metrics: Mapping[str, float], threshold: float) -> Optional[str]:
    """A warning when more than `threshold` of the batch's retriever items failed (request errors
    included: an unknown document or a page out of range fails an item too)."""
    items = metrics.get("retriever/items", 0.0)
    failed = metrics.get("retriever/failures", 0.0)
    if not items or failed / items <= threshold:
        return None
    kinds = {key.split("/", 2)[-1]: value for key, value in metrics.items()
             if key.startswith("retriever/failures/") and value}
    return (f"{failed:.0f} of {items:.0f} retriever items failed in this batch ({failed / items:.0%} > "
            f"{threshold:.0%}): {kinds}")


__all__ = ["RetrieverPreflightError", "enforce", "failure_rate_warning", "missing_documents",
           "page_count_problem", "page_count_value", "preflight_problem", "recorded_page_counts"]
