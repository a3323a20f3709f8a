"""The wire format (ALDEN's ``/batch_search``, ``/batch_fetch``, and this project's
``/batch_crop``): request bodies and answer parsers.

Pure functions, no I/O: `search_body` / `fetch_body` / `crop_body` build a request's body;
`parse_search_results` / `parse_fetch_results` / `parse_crop_results` turn its parsed answer
into, per item, a `RetrievedPage` (search: a list of them) or a `RetrieverFailure`. Whatever a server sends, a parser returns one outcome per
requested item or raises `MalformedResponse` (the answer's overall shape is wrong, so no item of
the chunk can be trusted): a bad item fails that item only ("malformed"); an error item
(``{"id": "error", "contents": reason}``) fails it as the asker's mistake ("request", when its
``code`` is one of the contract's request codes) or a server fault ("server"); a fetch answered
with another page's echo fails as "malformed" (results likely out of order), as does a crop
answered with another page's id. `is_wire_item` is
the item check, shared with the recorded fixtures. Images are NOT decoded here: an image's
`contents` is the JPEG bytes (a MessagePack answer) or base64 text (a JSON answer, fixtures);
text pages are always `str`.
"""

from __future__ import annotations

from typing import Any, Sequence

from retriever_server import contract

from .types import FetchSpec, RetrievedPage, RetrieverFailure

ERROR_ID = contract.ERROR_ID


class MalformedResponse(Exception):
    """A response whose overall shape is wrong: no item of the chunk can be trusted."""


def search_body(queries: Sequence[str], doc_ids: Sequence[str | None], top_n: int) -> dict:
    """A doc id per query; None (JSON null) searches the whole corpus."""
    return {"query": list(queries), "id": list(doc_ids), "top_n": top_n, "return_score": False}


def fetch_body(specs: Sequence[FetchSpec], doc_ids: Sequence[str]) -> dict:
    return {"query": [s.wire() for s in specs], "id": list(doc_ids)}


def crop_body(doc_ids: Sequence[str], pages: Sequence[int], boxes: Sequence[Sequence[float]],
              min_pixels: int, max_pixels: int, factor: int) -> dict:
    return {"id": list(doc_ids), "page": list(pages), "box": [list(b) for b in boxes],
            "min_pixels": min_pixels, "max_pixels": max_pixels, "factor": factor}


def _expect_list(data: Any, n: int) -> list:
    if not isinstance(data, list):
        raise MalformedResponse(f"retriever sent a malformed response (expected a list, got {type(data).__name__})")
    if len(data) != n:
        raise MalformedResponse(f"retriever sent a malformed response ({len(data)} results for {n} requests)")
    return data


def is_wire_item(x: Any) -> bool:
    """An item: a str id and contents that are text, or an image's bytes (MessagePack answers);
    an error item's contents (its reason) must be text."""
    if not isinstance(x, dict) or not isinstance(x.get("id"), str):
        return False
    contents = x.get("contents")
    return isinstance(contents, str) or (isinstance(contents, bytes) and x["id"] != ERROR_ID)


def _malformed_item(what: str) -> RetrieverFailure:
    return RetrieverFailure("malformed", f"retriever sent a malformed {what}")


def _page_of(item: dict, page_id: str) -> int | None:
    page = item.get("page")
    if isinstance(page, int) and not isinstance(page, bool):
        return page if page >= 1 else None
    parsed = contract.parse_page_id(page_id)
    return parsed[1] if parsed and parsed[1] >= 1 else None


def _item_failure(item: dict) -> RetrieverFailure:
    """An error item: the asker's mistake when its code says so, else a server fault."""
    code = item.get("code")  # a string when sent; anything else is a server fault too
    # An unknown document is the asker's mistake too (the dataset names a document the index lacks).
    asker = contract.REQUEST_CODES | {contract.UNKNOWN_DOCUMENT}
    kind = "request" if isinstance(code, str) and code in asker else "server"
    return RetrieverFailure(kind, item["contents"])


def _score_of(item: dict) -> float | None:
    s = item.get("score")
    if not isinstance(s, (int, float)) or isinstance(s, bool):
        return None
    try:
        return float(s)
    except OverflowError:  # an int no float holds (the standard library's JSON reads any)
        return None


def _doc_of(item: dict, page_id: str) -> str | None:
    """A corpus hit's document: its ``doc_id`` field, else its page id's; None if neither reads."""
    doc = item.get("doc_id")
    if isinstance(doc, str) and doc:
        return doc
    parsed = contract.parse_page_id(page_id)
    return parsed[0] if parsed else None


def parse_search_results(data: Any, doc_ids: Sequence[str | None], top_n: int) -> list[list[RetrievedPage] | RetrieverFailure]:
    """One entry per query. A bad list for one query fails that query only; a bad outer shape
    raises MalformedResponse (results can't be matched to queries). A corpus search (doc id None)
    labels each hit with its own document; a hit whose document cannot be read fails the query."""
    out: list[list[RetrievedPage] | RetrieverFailure] = []
    for doc_id, hits in zip(doc_ids, _expect_list(data, len(doc_ids))):
        if not isinstance(hits, list) or not all(is_wire_item(h) for h in hits):
            out.append(_malformed_item("search result"))
            continue
        err = next((h for h in hits if h["id"] == ERROR_ID), None)
        if err is not None:
            out.append(_item_failure(err))
            continue
        docs = [doc_id if doc_id is not None else _doc_of(h, h["id"]) for h in hits[:top_n]]
        if None in docs:
            out.append(_malformed_item("corpus search hit (no document named)"))
            continue
        out.append(
            [
                RetrievedPage(h["id"], doc, _page_of(h, h["id"]), "image", h["contents"], _score_of(h))
                for h, doc in zip(hits[:top_n], docs)
            ]
        )
    return out


def parse_fetch_results(data: Any, specs: Sequence[FetchSpec], doc_ids: Sequence[str]) -> list[RetrievedPage | RetrieverFailure]:
    out: list[RetrievedPage | RetrieverFailure] = []
    for spec, doc_id, item in zip(specs, doc_ids, _expect_list(data, len(specs))):
        if not is_wire_item(item):
            out.append(_malformed_item("fetch result"))
        elif item["id"] == ERROR_ID:
            out.append(_item_failure(item))
        elif spec.modality == "text" and not isinstance(item["contents"], str):
            out.append(_malformed_item("text page (bytes, not text)"))
        elif _echo_mismatch(item["id"], spec):
            # The server answered a different request: results are likely out of order.
            out.append(RetrieverFailure("malformed", f"retriever answered {item['id']!r} to {spec.wire()!r}"))
        else:
            out.append(RetrievedPage(f"{doc_id}_{spec.page}", doc_id, spec.page, spec.modality, item["contents"], _score_of(item)))
    return out


def _echo_mismatch(echo: str, spec: FetchSpec) -> bool:
    try:
        return FetchSpec.parse(echo) != spec
    except ValueError:
        return False  # an id we can't read is tolerated: the wire only promises "error" or the echo


def parse_crop_results(data: Any, doc_ids: Sequence[str], pages: Sequence[int],
                       boxes: Sequence[Sequence[float]]) -> list[RetrievedPage | RetrieverFailure]:
    """One entry per crop: an image `RetrievedPage` of the page it was cut from, labelled with
    its region (`boxes[i]`, fractions of the page), or a failure."""
    out: list[RetrievedPage | RetrieverFailure] = []
    for doc_id, page, box, item in zip(doc_ids, pages, boxes, _expect_list(data, len(doc_ids))):
        wanted = contract.page_id(doc_id, page)
        if not is_wire_item(item):
            out.append(_malformed_item("crop result"))
        elif item["id"] == ERROR_ID:
            out.append(_item_failure(item))
        elif item["id"] != wanted:
            out.append(RetrieverFailure("malformed", f"retriever answered {item['id']!r} to a crop of {wanted!r}"))
        else:
            out.append(RetrievedPage(wanted, doc_id, page, "image", item["contents"],
                                     region=tuple(float(v) for v in box)))
    return out
