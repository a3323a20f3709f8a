"""The retriever's wire contract in one dependency-free module (standard library only).

The server writes these forms, the rollout's client and the recorded fixtures read them: one
definition, so the three cannot drift apart (`vrag_rollout` imports this module; it imports
nothing of either package).

- Page ids: ``"<doc>_<page>"``, the page 1-based (VRAG's naming); a doc id may itself contain
  underscores, the page is what follows the last one.
- Search scope (``POST /batch_search``'s ``id``): absent or ``null``: every query searches the
  whole corpus; a string: that document for every query; a list with one entry per query, each
  a doc id (that document), ``null`` (the whole corpus) or a non-empty list of doc ids (only
  those documents). ``POST /search`` takes a doc id, ``null``/absent or a list. Hits name their
  document (``doc_id``, and the page id); equal scores rank by (document order in the index,
  page). A subset naming an unknown document is an `UNKNOWN_DOCUMENT` error item, an empty one
  a `MALFORMED_QUERY` error item. Doc-scoped requests are answered as they always were.
- Fetch specs: ``"image, 3"`` / ``"text, 3"`` (modality, 1-based page; case and spaces are
  forgiven when read); ALDEN's ``"3-th"`` reads as ``"image, 3"``. Written canonically by
  `fetch_spec`.
- Crop requests (``POST /batch_crop``): parallel lists ``id`` (or one doc id for all), ``page``
  (1-based) and ``box`` (``[x1, y1, x2, y2]``, fractions 0..1 of the page's width and height,
  origin top left), plus one pixel band ``min_pixels`` / ``max_pixels`` and the side ``factor``
  for the whole request. Each item answers ``{"id": "<doc>_<page>", "contents": image, ...}`` or
  an error item; `box_problem` is the one check of a box's form, shared by the server and the
  client (which answers a bad box itself, without a round trip). At most `MAX_CROP_BATCH` crops
  a request, and at most `MAX_CROP_REQUEST_PIXELS` pixels in all, each crop counted at the band's
  ``max_pixels`` (`crops_per_request` says how many fit); a server refuses a request over either
  before drawing anything.
- Refusals (admission control): ``503`` with ``Retry-After`` in whole seconds and
  `RETRY_AFTER_MS` (``Retry-After-Ms``), the same wait in milliseconds, for clients that can
  come back sooner than a second.
- Error items: ``{"id": "error", "contents": reason, "code": code}`` in place of one answer of a
  batch; `code` says whose mistake it was. `REQUEST_CODES` are the asker's (a page the document
  does not have, an unreadable fetch, a bad crop box): for an agent, the policy's mistake, not a retriever fault.
  Items from older servers carry no code and count as `UNREADABLE` (a server fault).
- Answer formats: JSON (the default, ALDEN's: image ``contents`` are base64 text) or, for a
  request whose ``Accept`` prefers `MSGPACK`, the same values in MessagePack with each image's
  ``contents`` the JPEG bytes themselves (a ``bin``), a quarter smaller and nothing to decode.
  Text contents and error reasons are strings in both. The answer's ``Content-Type`` says which.
"""

from __future__ import annotations

import math
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
BAD_BOX = "bad_box"  # a crop box that is not a region of the page (see `box_problem`)
REQUEST_CODES = frozenset({MALFORMED_FETCH, MALFORMED_QUERY, PAGE_OUT_OF_RANGE, BAD_BOX})

# Crops: a box side under this fraction of the page's side is refused (a sliver has nothing to
# read), as is one under MIN_CROP_SOURCE_SIDE units of its source (points of a PDF page, pixels
# of a stored page image: the server checks that, knowing the page's size).
MIN_BOX_FRACTION = 0.02
MIN_CROP_SOURCE_SIDE = 8
MAX_CROP_BATCH = 64  # crops per /batch_crop request (the client chunks by it)
# Pixels one /batch_crop request may draw in all, each crop counted at the band's max_pixels (the
# most it can have): 64 crops at the default band (1280 visual tokens of 28 x 28 pixels), or 5 at
# the largest band a server accepts. Crops are drawn under one process-wide pdfium lock, so this
# bounds how long one request keeps every other crop waiting: 1.2 s of CPU for 64 full-page crops
# at the default band, 1.8 s for 5 at the largest, on the development machine (64 at the largest
# band, unbounded before, took about 20 s).
MAX_CROP_REQUEST_PIXELS = MAX_CROP_BATCH * 1280 * 28 * 28
CROP_FACTOR = 28  # default side multiple of a crop (Qwen2/2.5-VL's merged patch; Qwen3-VL: 32)
MIN_CROP_FACTOR, MAX_CROP_FACTOR = 8, 64

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


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite(value) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int no float holds
        return False


def box_problem(box) -> Optional[str]:
    """Why ``box`` is not a crop box (a readable reason), or None when it is one: 4 finite
    numbers ``[x1, y1, x2, y2]`` in [0, 1] with ``x2 - x1`` and ``y2 - y1`` at least
    `MIN_BOX_FRACTION`. Pure; the page's own size is checked by the server."""
    shown = repr(list(box) if isinstance(box, tuple) else box)
    shown = shown if len(shown) <= 80 else shown[:80] + "..."  # a reason, not an echo
    if not isinstance(box, (list, tuple)) or len(box) != 4 or not all(map(_is_number, box)):
        return (f"box must be 4 numbers [x1, y1, x2, y2] (fractions 0..1 of the page's width and "
                f"height, top left first), got {shown}")
    if not all(map(_is_finite, box)):
        return f"box {shown} holds a value that is not a finite number"
    if not all(0.0 <= v <= 1.0 for v in box):
        return (f"box {shown} reaches outside the page: every value must be between 0 and 1 "
                f"(fractions of the page's width and height)")
    x1, y1, x2, y2 = box
    if x2 <= x1 or y2 <= y1:
        return (f"box {shown} is empty or inverted: need x1 < x2 and y1 < y2 "
                f"(top left corner first, then bottom right)")
    if x2 - x1 < MIN_BOX_FRACTION or y2 - y1 < MIN_BOX_FRACTION:
        return (f"box {shown} is too small: each side must be at least {MIN_BOX_FRACTION:g} "
                f"of the page's")
    return None


def crop_band_problem(min_pixels, max_pixels, factor) -> Optional[str]:
    """Why a crop request's pixel band cannot be read (a request-level problem), or None: ints
    with ``factor`` in [MIN_CROP_FACTOR, MAX_CROP_FACTOR] and factor^2 <= min <= max pixels.
    (A server may cap ``max_pixels`` lower; it says so.)"""
    if not all(isinstance(v, int) and not isinstance(v, bool)
               for v in (min_pixels, max_pixels, factor)):
        return (f"min_pixels, max_pixels and factor must be ints, got {min_pixels!r}, "
                f"{max_pixels!r}, {factor!r}")
    if not MIN_CROP_FACTOR <= factor <= MAX_CROP_FACTOR:
        return f"factor must be between {MIN_CROP_FACTOR} and {MAX_CROP_FACTOR}, got {factor}"
    if not factor ** 2 <= min_pixels <= max_pixels:
        return (f"need factor^2 ({factor ** 2}) <= min_pixels <= max_pixels, got "
                f"min_pixels={min_pixels}, max_pixels={max_pixels}")
    return None


def crops_per_request(max_pixels: int, request_pixels: int = MAX_CROP_REQUEST_PIXELS) -> int:
    """How many crops of up to ``max_pixels`` pixels one /batch_crop request may hold: as many as
    ``request_pixels`` allows, at most `MAX_CROP_BATCH` and at least 1."""
    return max(1, min(MAX_CROP_BATCH, request_pixels // max(1, max_pixels)))


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
