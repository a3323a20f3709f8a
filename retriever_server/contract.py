"""The retriever's wire contract in one dependency-free module (standard library only).

The server writes these forms, the rollout's client and the recorded fixtures read them: one
definition, so the three cannot drift apart (`vrag_rollout` imports this module; it imports
nothing of either package).

- Page ids: ``"<doc>_<page>"``, the page 1-based (VRAG's naming); a doc id may itself contain
  underscores, the page is what follows the last one.
- Fetch specs: ``"image, 3"`` / ``"text, 3"`` (modality, 1-based page; case and spaces are
  forgiven when read); ALDEN's ``"3-th"`` reads as ``"image, 3"``. Written canonically by
  `fetch_spec`.
- Refusals (admission control): ``503`` with ``Retry-After`` in whole seconds and
  `RETRY_AFTER_MS` (``Retry-After-Ms``), the same wait in milliseconds, for clients that can
  come back sooner than a second.
- Error items: ``{"id": "error", "contents": reason, "code": code}`` in place of one answer of a
  batch; `code` says whose mistake it was. `REQUEST_CODES` are the asker's (a page the document
  does not have, an unreadable fetch): for an agent, the policy's mistake, not a retriever fault.
  Items from older servers carry no code and count as `UNREADABLE` (a server fault).
"""

from __future__ import annotations

import re
from typing import Optional

ERROR_ID = "error"
RETRY_AFTER_MS = "Retry-After-Ms"  # header of a refusal: the predicted wait, in milliseconds
MODALITIES = ("image", "text")

# Error codes.
MALFORMED_FETCH = "malformed_fetch"  # the fetch spec cannot be read
MALFORMED_QUERY = "malformed_query"  # an empty or over-long search query
PAGE_OUT_OF_RANGE = "page_out_of_range"  # the document has no such page
UNKNOWN_DOCUMENT = "unknown_document"  # the index has no such document (a data problem)
UNREADABLE = "unreadable"  # the server could not read a page it has (a server fault)
REQUEST_CODES = frozenset({MALFORMED_FETCH, MALFORMED_QUERY, PAGE_OUT_OF_RANGE})

_FETCH = re.compile(r"^\s*(image|text)\s*,\s*(\d{1,9})\s*$", re.IGNORECASE)
_NTH = re.compile(r"^\s*(\d{1,9})\s*-\s*th\s*$", re.IGNORECASE)
_PAGE_ID = re.compile(r"^(.+)_(\d{1,9})$")


def page_id(doc_id: str, page: int) -> str:
    return f"{doc_id}_{page}"


def parse_page_id(text: str) -> Optional[tuple[str, int]]:
    """``"annual_report_3"`` -> ("annual_report", 3); None if it is not a page id."""
    match = _PAGE_ID.match(text) if isinstance(text, str) else None
    return (match.group(1), int(match.group(2))) if match else None


def fetch_spec(modality: str, page: int) -> str:
    return f"{modality}, {page}"


def parse_fetch_spec(text: str) -> Optional[tuple[str, int]]:
    """A fetch spec -> (modality, page as written); None if it cannot be read. The page may be 0
    or past the end: range is the server's to judge."""
    if not isinstance(text, str):
        return None
    if (match := _FETCH.match(text)) is not None:
        return match.group(1).lower(), int(match.group(2))
    if (match := _NTH.match(text)) is not None:
        return "image", int(match.group(1))
    return None


def error_fields(reason: str, code: str) -> dict:
    """The JSON object of an error item."""
    return {"id": ERROR_ID, "contents": reason, "code": code}
