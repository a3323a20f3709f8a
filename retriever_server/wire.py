"""JSON bytes of the wire format, assembled from pre-serialised fragments.

A search answer is mostly base64 image data that never changes, so each page's JSON is kept as
ready bytes (``PageFragment``) and a response is one ``b"".join``: no per-request encoding of
images and no JSON serialisation of megabytes of strings.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass

from . import contract


page_id = contract.page_id  # VRAG's page naming: ``<doc>_<page>``, page 1-based


def _s(value: str) -> bytes:
    return json.dumps(value).encode("ascii")


@dataclass(frozen=True)
class PageFragment:
    """A page's search-hit object without its closing brace: head + b64 + tail."""

    head: bytes
    b64: bytes
    tail: bytes

    @property
    def nbytes(self) -> int:
        return len(self.head) + len(self.b64) + len(self.tail)


def make_fragment(doc_id: str, page: int, jpeg: bytes, mime: str = "image/jpeg",
                  extra: dict | None = None) -> PageFragment:
    """``extra``: optional page fields (e.g. ``role``, ``headings``) appended after ``mime``."""
    head = b'{"id":' + _s(page_id(doc_id, page)) + b',"contents":"'
    tail = b'","doc_id":' + _s(doc_id) + b',"page":' + str(page).encode() + b',"mime":' + _s(mime)
    for key, value in (extra or {}).items():
        tail += b"," + _s(key) + b":" + json.dumps(value).encode("ascii")
    return PageFragment(head, base64.b64encode(jpeg), tail)


def _score(score: float) -> bytes:
    return json.dumps(score if math.isfinite(score) else 0.0).encode()


def hit_parts(fragment: PageFragment, score: float | None) -> list[bytes]:
    if score is None:
        return [fragment.head, fragment.b64, fragment.tail, b"}"]
    return [fragment.head, fragment.b64, fragment.tail, b',"score":', _score(score), b"}"]


def image_fetch_parts(spec_id: str, fragment: PageFragment) -> list[bytes]:
    """A fetch answer ``{"id": "image, 3", "contents": b64, ...}`` sharing the cached base64."""
    return [b'{"id":', _s(spec_id), b',"contents":"', fragment.b64, fragment.tail, b"}"]


def item_json(item_id: str, contents: str, **extra) -> bytes:
    return json.dumps({"id": item_id, "contents": contents, **extra}).encode("ascii")


def error_item(reason: str, code: str = contract.UNREADABLE) -> bytes:
    """``{"id": "error", "contents": reason, "code": code}`` (codes in ``contract``)."""
    return json.dumps(contract.error_fields(reason, code)).encode("ascii")


def json_list(items: list[bytes]) -> list[bytes]:
    """Parts of ``[item, item, ...]``."""
    parts = [b"["]
    for i, item in enumerate(items):
        if i:
            parts.append(b",")
        parts.append(item)
    parts.append(b"]")
    return parts
