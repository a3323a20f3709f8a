"""Request and response models of the HTTP API (the ALDEN / VRAG wire format)."""

from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field

from ..contract import CROP_FACTOR
from ..storage.imaging import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS


# One search item's scope: a doc id (that document), null (the whole corpus) or a list of doc
# ids (only those documents; empty is that item's error).
ScopeId = Union[str, list[str], None]


class BatchSearchRequest(BaseModel):
    # Unknown fields (ALDEN's recall_ocr, mm_fetch) are accepted and ignored.
    model_config = ConfigDict(extra="ignore")
    query: list[str] = Field(description="one query per item")
    id: Union[list[ScopeId], str, None] = Field(
        None, description="search scope: one doc id for all queries, or one entry per query "
                          "(a doc id, null for the whole corpus, or a list of doc ids); absent "
                          "or null: every query searches the whole corpus")
    top_n: int = Field(10, description="pages per query, best first")
    return_score: bool = Field(False, description="add a `score` field to each hit")


class BatchFetchRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    query: list[str] = Field(description='"image, <page>", "text, <page>" or "<page>-th"; 1-based')
    id: list[str] | str = Field(description="doc id per fetch (or one doc id for all)")


class BatchCropRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: list[str] | str = Field(description="doc id per crop (or one doc id for all)")
    page: list[int] = Field(description="1-based page per crop")
    # Any JSON per box: a box that is not 4 numbers is that item's error, not the request's.
    box: list[Any] = Field(description="[x1, y1, x2, y2] per crop: fractions 0..1 of the page's "
                                       "width and height, top left corner first")
    min_pixels: int = Field(DEFAULT_MIN_PIXELS, description="each crop has at least this many "
                                                           "pixels")
    max_pixels: int = Field(DEFAULT_MAX_PIXELS, description="each crop has at most this many "
                                                           "pixels (the sharpest that fits)")
    factor: int = Field(CROP_FACTOR, description="crop sides are multiples of this (28: "
                                                 "Qwen2/2.5-VL, 32: Qwen3-VL)")


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    query: str
    id: ScopeId = Field(None, description="a doc id, a list of doc ids, or absent/null for the "
                                          "whole corpus")
    top_n: int = 10
    return_score: bool = False


class FetchRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    query: str = Field(description='"image, <page>", "text, <page>" or "<page>-th"; 1-based')
    id: str


class Item(BaseModel):
    """A hit, a fetched page, or ``{"id": "error", "contents": reason}``."""

    id: str = Field(description='page id "<doc>_<page>" (1-based), "image, 3", "text, 3" or "error"')
    contents: str = Field(description="standard base64 JPEG (in a MessagePack answer: the JPEG "
                                      "bytes), page text, or the error reason")
    doc_id: str | None = None
    page: int | None = None
    mime: str | None = None
    score: float | None = None
    role: str | None = Field(None, description='page role: "body", "contents", "index" or "front"')
    headings: list[str] | None = Field(None, description="heading lines found on the page")
    code: str | None = Field(None, description="an error item's code: whose mistake it was")
    box: list[float] | None = Field(None, description="a crop's box, as asked for")
    width: int | None = Field(None, description="a crop's width in pixels")
    height: int | None = Field(None, description="a crop's height in pixels")
    source: str | None = Field(None, description='what a crop was drawn from: "pdf" or '
                                                 '"page_image"')


class DocumentInfo(BaseModel):
    doc_id: str
    num_pages: int


class DocumentList(BaseModel):
    documents: list[DocumentInfo]


class Health(BaseModel):
    status: str
    backend: str
    documents: int
    pages: int


class Problem(BaseModel):
    """Body of a 401 / 413 / 422 answer."""

    detail: str = Field(description="what is wrong with the request, in words")
