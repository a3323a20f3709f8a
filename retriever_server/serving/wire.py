"""The wire format's bytes, JSON or MessagePack, rendered from one answer tree.

The service builds an answer as a tree of lists whose leaves are `HitItem` (a search hit),
`ImageFetch` (an image fetch) or a plain dict (a text page, an error item, a crop made by
`image_item` in the answer's form); `render` writes it
in the negotiated format (``contract.JSON`` or ``contract.MSGPACK``) with the same values.

An answer is mostly page images that never change, so each page is a `PageFragment`: its fields,
and its image in the forms asked for so far, the base64 text inside ready JSON framing (a
JSON answer is one ``b"".join``: no per-request encoding of megabytes of strings) and the JPEG
bytes for MessagePack (one copy into the answer). A form is derived from the other on first
use, through `FragmentCache`, which counts its bytes.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import Any, Optional, Union

import msgspec

from .. import contract

page_id = contract.page_id  # VRAG's page naming: ``<doc>_<page>``, page 1-based
FORMS = (contract.JSON, contract.MSGPACK)


def _s(value: str) -> bytes:
    return json.dumps(value).encode("ascii")


class PageFragment:
    """One page, ready to serve: ``fields`` (every item field but ``id`` and ``contents``) and
    the image as base64 (``b64``, for JSON) and/or JPEG bytes (``jpeg``, for MessagePack).
    Holds at least one of the two; `derive` + `adopt` add the other (`FragmentCache.get` does)."""

    __slots__ = ("page_id", "fields", "json_head", "json_tail", "b64", "jpeg")

    def __init__(self, doc_id: str, page: int, *, jpeg: Optional[bytes] = None,
                 b64: Optional[bytes] = None, mime: str = "image/jpeg", extra: dict | None = None):
        if jpeg is None and b64 is None:
            raise ValueError("a page fragment needs its image as JPEG bytes or base64")
        self.page_id = page_id(doc_id, page)
        self.fields = {"doc_id": doc_id, "page": page, "mime": mime, **(extra or {})}
        self.json_head = b'{"id":' + _s(self.page_id) + b',"contents":"'
        self.json_tail = b'",' + json.dumps(self.fields, separators=(",", ":")).encode("ascii")[1:-1]
        self.jpeg, self.b64 = jpeg, b64

    def has(self, form: str) -> bool:
        return (self.b64 if form == contract.JSON else self.jpeg) is not None

    def derive(self, form: str) -> bytes:
        """The image in ``form`` from the form it has (not stored: see `FragmentCache`)."""
        if form == contract.JSON:
            return self.b64 if self.b64 is not None else base64.b64encode(self.jpeg)
        return self.jpeg if self.jpeg is not None else base64.b64decode(self.b64)

    def adopt(self, form: str, image: bytes) -> int:
        """Keep ``image`` (from `derive`) as the ``form``; the bytes added (0 if it had it)."""
        if self.has(form):
            return 0
        if form == contract.JSON:
            self.b64 = image
        else:
            self.jpeg = image
        return len(image)

    @property
    def nbytes(self) -> int:
        return (len(self.json_head) + len(self.json_tail) + len(self.b64 or b"")
                + len(self.jpeg or b""))


def make_fragment(doc_id: str, page: int, jpeg: bytes, mime: str = "image/jpeg",
                  extra: dict | None = None, form: str = contract.JSON) -> PageFragment:
    """A fragment holding the image in ``form`` only; ``extra``: optional page fields (e.g.
    ``role``, ``headings``) after ``mime``."""
    if form == contract.JSON:
        return PageFragment(doc_id, page, b64=base64.b64encode(jpeg), mime=mime, extra=extra)
    return PageFragment(doc_id, page, jpeg=jpeg, mime=mime, extra=extra)


@dataclass(frozen=True)
class HitItem:
    """A search hit: the page's item, with ``score`` when one was asked for."""

    fragment: PageFragment
    score: Optional[float] = None


@dataclass(frozen=True)
class ImageFetch:
    """An image fetch: the page's item under the fetch spec's id (e.g. ``"image, 3"``)."""

    spec_id: str
    fragment: PageFragment


Node = Union[HitItem, ImageFetch, dict, list]


def _finite(score: float) -> float:
    return score if math.isfinite(score) else 0.0


def text_item(item_id: str, contents: str, **extra: Any) -> dict:
    return {"id": item_id, "contents": contents, **extra}


def image_item(item_id: str, jpeg: bytes, form: str, **extra: Any) -> dict:
    """An image item made for one answer (a crop: never cached), its contents in ``form``:
    base64 text for JSON, the JPEG bytes for MessagePack."""
    contents = base64.b64encode(jpeg).decode("ascii") if form == contract.JSON else jpeg
    return {"id": item_id, "contents": contents, **extra}


def error_item(reason: str, code: str = contract.UNREADABLE) -> dict:
    """``{"id": "error", "contents": reason, "code": code}`` (codes in ``contract``)."""
    return contract.error_fields(reason, code)


# --------------------------------------------------------------------------- JSON


def _json_parts(node: Node, parts: list[bytes]) -> None:
    if isinstance(node, list):
        parts.append(b"[")
        for i, child in enumerate(node):
            if i:
                parts.append(b",")
            _json_parts(child, parts)
        parts.append(b"]")
    elif isinstance(node, HitItem):
        f = node.fragment
        parts += [f.json_head, f.b64, f.json_tail]
        if node.score is not None:
            parts += [b',"score":', json.dumps(_finite(node.score)).encode()]
        parts.append(b"}")
    elif isinstance(node, ImageFetch):
        f = node.fragment
        parts += [b'{"id":', _s(node.spec_id), b',"contents":"', f.b64, f.json_tail, b"}"]
    else:
        parts.append(json.dumps(node).encode("ascii"))


# --------------------------------------------------------------------------- MessagePack

_msgpack = msgspec.msgpack.Encoder()


def _plain(node: Node) -> Any:
    if isinstance(node, list):
        return [_plain(child) for child in node]
    if isinstance(node, HitItem):
        f = node.fragment
        item = {"id": f.page_id, "contents": f.jpeg, **f.fields}
        if node.score is not None:
            item["score"] = _finite(node.score)
        return item
    if isinstance(node, ImageFetch):
        return {"id": node.spec_id, "contents": node.fragment.jpeg, **node.fragment.fields}
    return node


def _check_forms(node: Node, form: str) -> None:
    if isinstance(node, list):
        for child in node:
            _check_forms(child, form)
    elif isinstance(node, (HitItem, ImageFetch)) and not node.fragment.has(form):
        raise ValueError(f"page {node.fragment.page_id} is not held in the form {form!r} "
                         f"(get it through FragmentCache.get(..., form))")


def render(tree: Node, form: str = contract.JSON) -> bytes:
    """The answer's bytes in ``form``; its fragments must hold that form (`FragmentCache.get`),
    else ValueError (never an answer with an image missing)."""
    if form not in FORMS:
        raise ValueError(f"unknown answer form {form!r}; one of {FORMS}")
    _check_forms(tree, form)
    if form == contract.MSGPACK:
        return _msgpack.encode(_plain(tree))
    parts: list[bytes] = []
    _json_parts(tree, parts)
    return b"".join(parts)
