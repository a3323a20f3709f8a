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
- Answer formats: JSON (the default, ALDEN's: image ``contents`` are base64 text) or, for a
  request whose ``Accept`` prefers `MSGPACK`, the same values in MessagePack with each image's
  ``contents`` the JPEG bytes themselves (a ``bin``), a quarter smaller and nothing to decode.
  Text contents and error reasons are strings in both. The answer's ``Content-Type`` says which.
"""

from __future__ import annotations

import re
from typing import Optional

ERROR_ID = "error"
RETRY_AFTER_MS = "Retry-After-Ms"  # header of a refusal: the predicted wait, in milliseconds
JSON = "application/json"
MSGPACK = "application/msgpack"
# Spellings of MessagePack's media type in use (the registered one is application/vnd.msgpack).
MSGPACK_TYPES = frozenset({MSGPACK, "application/x-msgpack", "application/vnd.msgpack"})
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


def _accept_q(param_text: str) -> float:
    for param in param_text.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                q = float(value)
            except ValueError:
                return 0.0
            return q if 0.0 <= q <= 1.0 else 0.0
    return 1.0


def prefers_msgpack(accept: Optional[str]) -> bool:
    """Whether an ``Accept`` header asks for MessagePack at least as much as for JSON
    (``*/*`` and ``application/*`` count for JSON; a missing header means JSON)."""
    best_msgpack, best_json = 0.0, 0.0
    for entry in (accept or "").split(","):
        media, _, params = entry.partition(";")
        media = media.strip().lower()
        q = _accept_q(params)
        if media in MSGPACK_TYPES:
            best_msgpack = max(best_msgpack, q)
        elif media in (JSON, "application/*", "*/*"):
            best_json = max(best_json, q)
    return best_msgpack > 0.0 and best_msgpack >= best_json


def is_msgpack(content_type: Optional[str]) -> bool:
    """Whether an answer's ``Content-Type`` names MessagePack."""
    return (content_type or "").partition(";")[0].strip().lower() in MSGPACK_TYPES
