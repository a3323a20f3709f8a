"""Before a rollout: is the retriever there, and does it serve the batch's documents?

Contract:

- `preflight_problem(client, doc_ids, known)` returns None when the retriever answers and serves
  every document of `doc_ids` (None entries, samples without a document, are skipped), else one
  message that names the fix. `known` caches the documents already confirmed, so a later batch
  asks the retriever only about documents it has not seen (the listing is fetched again then:
  an index may have been reloaded with new documents).
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
from typing import Any, Iterable, Mapping, Optional

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


def preflight_problem(client: Any, doc_ids: Iterable[Optional[str]], known: set) -> Optional[str]:
    wanted = [doc for doc in dict.fromkeys(doc_ids) if doc is not None and doc not in known]
    if not wanted and known:
        return None
    where = _where(client)
    lister = getattr(client, "documents", None)
    if lister is None:  # a retriever object of the caller's own that cannot list: trust it
        return None
    try:
        served = lister()
    except TransportError as error:
        return (f"{where} is unreachable ({error}): start it (`vrag-retriever serve --index DIR`) "
                f"or point retriever_url at a running one")
    if served is None:  # cannot list: reachability was all there was to check
        known.update(wanted)
        return None
    missing = missing_documents(served, wanted)
    known.update(doc for doc in wanted if doc in served)
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
           "preflight_problem"]
