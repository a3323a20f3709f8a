"""Before a rollout: is the retriever there, and does it serve the batch's documents?

Contract:

- `DocumentCheck(client, known=None)`: a process's check, asked once and reused.
  `problem(doc_ids, page_counts=None)` returns None when the retriever answers and serves every
  document of `doc_ids` (None entries, samples without a document, are skipped) with the page
  counts the data recorded (`page_counts`, aligned with `doc_ids`, None where none was
  recorded), else one message that names the fix. The retriever is asked (`GET /documents`, the
  whole index's listing) only when the answer is not known yet: on first use (in corpus scope
  too, where no document is named: is it there at all?), and when a document is named that the
  last listing lacked (the index may have been reloaded with it). Every other call, whatever
  documents it names, is answered from the last listing: one listing per process, not one per
  batch or trajectory. `known` ({doc_id: page count}) holds the documents confirmed so far.
  Thread-safe: callers that need a listing at the same time wait for one request; callers
  answered from the cache never wait for a request.
- `preflight_problem(client, doc_ids, known, page_counts=None)`: the same check once, with
  `known` as its cache of confirmed documents (a `known` that holds documents stands for a
  retriever already seen to answer).
- A retriever that cannot list its documents (recorded fixtures; a server without
  `GET /documents`) is checked for reachability only, once; a retriever object without a
  `documents` method (the caller's own) is not checked.
- `enforce(problem, mode, logger)`: mode "fail" raises `RetrieverPreflightError`, "warn" logs the
  message as a warning, "off" does nothing (the rollout does not even call the check then).
- `failure_rate_warning(metrics, threshold)`: the warning for a batch whose retriever calls failed
  more often than `threshold` (a fraction), or None.
"""

from __future__ import annotations

import logging
import threading
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
    return DocumentCheck(client, known).problem(doc_ids, page_counts)


class DocumentCheck:
    """What the retriever was seen to serve, asked about only when a call needs more (module
    docstring)."""

    def __init__(self, client: Any, known: Optional[dict] = None):
        self.client = client
        self.known = {} if known is None else known  # {doc_id: page count (None: not listed)}
        self.where = _where(client)
        self._served: Optional[Mapping[str, int]] = None  # the last listing
        self._listable = True  # False once the retriever answered without a listing
        self._answered = bool(self.known)  # the retriever has answered (it is there)
        self._asking = threading.Lock()

    def problem(self, doc_ids: Iterable[Optional[str]],
                page_counts: Optional[Sequence[Optional[int]]] = None) -> Optional[str]:
        doc_ids = list(doc_ids)
        recorded = recorded_page_counts(doc_ids, page_counts)
        if not self._settled(doc_ids):
            with self._asking:  # one request for every caller that needs it now
                if not self._settled(doc_ids):
                    problem = self._ask(doc_ids)
                    if problem is not None:
                        return problem
        return page_count_problem(self.where, recorded, self.known)

    def _settled(self, doc_ids: Sequence[Optional[str]]) -> bool:
        """Whether the cache answers for `doc_ids` (confirming what the last listing holds)."""
        if getattr(self.client, "documents", None) is None:  # a retriever of the caller's own: trusted
            return True
        wanted = self._wanted(doc_ids)
        if not self._answered:
            return False
        if not self._listable:  # reachability was all there was to check, and it was
            self.known.update(dict.fromkeys(wanted))
            return True
        if self._served is None or any(doc not in self._served for doc in wanted):
            return False
        self.known.update({doc: self._served[doc] for doc in wanted})
        return True

    def _wanted(self, doc_ids: Sequence[Optional[str]]) -> list[str]:
        return [doc for doc in dict.fromkeys(doc_ids) if doc is not None and doc not in self.known]

    def _ask(self, doc_ids: Sequence[Optional[str]]) -> Optional[str]:
        wanted = self._wanted(doc_ids)
        try:
            served = self.client.documents()
        except TransportError as error:
            return (f"{self.where} is unreachable ({error}): start it (`vrag-retriever serve --index DIR`) "
                    f"or point retriever_url at a running one")
        self._answered = True
        if served is None:  # cannot list: reachability was all there was to check
            self._listable = False
            self.known.update(dict.fromkeys(wanted))
            return None
        self._served = served
        missing = missing_documents(served, wanted)
        self.known.update({doc: served[doc] for doc in wanted if doc in served})
        if not missing:
            return None
        named = ", ".join(missing[:SHOWN]) + (f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else "")
        return (f"{self.where} does not serve {len(missing)} document(s) of this batch: {named} "
                f"(it serves {len(served)}): index them (`vrag-retriever index`), serve the index that has them, "
                f"or fix the dataset's doc_id column")


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


__all__ = ["DocumentCheck", "RetrieverPreflightError", "enforce", "failure_rate_warning", "missing_documents",
           "page_count_problem", "page_count_value", "preflight_problem", "recorded_page_counts"]
