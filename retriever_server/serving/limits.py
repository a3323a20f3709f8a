"""Request limits, and the pure per-item checks that turn bad items into readable reasons."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .. import contract


@dataclass(frozen=True)
class Limits:
    max_batch: int = 1024  # queries per /batch_search or /batch_fetch request
    max_query_chars: int = 2000
    max_top_n: int = 50
    max_body_bytes: int = 8 * 1024 * 1024
    # Answer bytes, bounded before searching (``answer_size``). A rollout's requests (64 queries
    # x top_n 1-3 of ~85 KiB pages: 7-21 MiB of JSON) fit with room; 1,024 queries x top_n 50
    # (up to 51,200 pages, gigabytes) do not.
    max_answer_bytes: int = 64 * 1024 * 1024
    # Crops are rendered per request (nothing cached): at most this many a /batch_crop request,
    # each at most this many pixels (Qwen2-VL's processor's own default max_pixels), and at most
    # ``max_crop_request_pixels`` in all, each crop counted at the band's max_pixels: the drawing
    # one request may cost, checked before anything is drawn (``service.RetrieverService``).
    max_crop_batch: int = contract.MAX_CROP_BATCH
    max_crop_pixels: int = 16384 * 28 * 28
    max_crop_request_pixels: int = contract.MAX_CROP_REQUEST_PIXELS

    def __post_init__(self):
        if self.max_answer_bytes < 1:
            raise ValueError(f"max_answer_bytes must be at least 1, got {self.max_answer_bytes}")
        if self.max_crop_request_pixels < self.max_crop_pixels:
            raise ValueError(f"max_crop_request_pixels ({self.max_crop_request_pixels}) must be at least "
                             f"max_crop_pixels ({self.max_crop_pixels}): one crop at the largest band must fit")


_ID_ECHO = 80  # how much of a bad id/spec we quote back


def _quote(value: str) -> str:
    return repr(value if len(value) <= _ID_ECHO else value[:_ID_ECHO] + "...")


def doc_problem(doc_id: str, documents: Mapping[str, int]) -> str | None:
    if doc_id in documents:
        return None
    return f"unknown document id {_quote(doc_id)}; GET /documents lists the indexed ids"


def subset_problem(doc_ids, documents: Mapping[str, int]) -> tuple[str, str] | None:
    """(reason, error code) of a subset scope that cannot be searched, else None."""
    if not doc_ids:
        return ("empty list of documents; give at least one doc id, or null to search the "
                "whole corpus", contract.MALFORMED_QUERY)
    for doc_id in sorted(doc_ids):
        if problem := doc_problem(doc_id, documents):
            return problem, contract.UNKNOWN_DOCUMENT
    return None


def query_problem(query: str, limits: Limits) -> str | None:
    if not query.strip():
        return "empty query; write a few keywords that describe the page you are looking for"
    if len(query) > limits.max_query_chars:
        return (f"query is {len(query)} characters long; the limit is {limits.max_query_chars}. "
                f"Use a shorter query")
    return None


def page_problem(doc_id: str, page: int, documents: Mapping[str, int]) -> str | None:
    count = documents[doc_id]
    if 1 <= page <= count:
        return None
    return f"page {page} is out of range; document {_quote(doc_id)} has pages 1..{count}"


def parse_fetch_spec(spec: str) -> tuple[str, int] | None:
    """``"image, 3"`` / ``"text, 3"`` / ``"3-th"`` -> (modality, 1-based page); None if malformed."""
    return contract.parse_fetch_spec(spec)


def fetch_spec_problem(spec: str) -> str:
    return (f"cannot read fetch request {_quote(spec)}; write \"image, <page>\" or "
            f"\"text, <page>\" with a page number counted from 1")
