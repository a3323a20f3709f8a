"""The retriever client's data types: what a caller asks for and what it gets back.

- `FetchSpec`: one page to fetch, as the model names it (``"image, 3"``, ``"text, 3"``: the
  contract's grammar, ALDEN's "3-th" included); a bad one raises ValueError.
- `RetrievedPage`: one page found (search) or fetched, or a region of one (crop). Images are NOT decoded: an image's
  `contents` is the JPEG bytes (a MessagePack answer) or base64 text (a JSON answer, fixtures);
  text pages are always `str`.
- `RetrieverFailure`: an item that could not be answered; its `kind` is one of `FAILURE_KINDS`
  and its message can be shown to the model as an observation.

Pure values: frozen dataclasses, no I/O; imports only the server's wire contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from retriever_server import contract

MODALITIES = ("image", "text")
# "request": the retriever refused the request as the asker's mistake (contract.REQUEST_CODES,
# e.g. a page the document does not have): for the agent, the policy's mistake, not a fault.
FAILURE_KINDS = ("timeout", "connection", "http", "malformed", "server", "overloaded", "request")


@dataclass(frozen=True)
class RetrievedPage:
    page_id: str  # search: the wire "id" (e.g. "annual_report_3"); fetch, crop: f"{doc_id}_{page}"
    doc_id: str  # the doc the request asked for
    page: int | None  # 1-based; from a "page" field, else the id's "_<n>" suffix, else None
    modality: str  # "image" | "text"
    # image: the JPEG bytes (MessagePack answer) or base64 text (JSON answer, fixtures);
    # text: the page text (always str). Never decoded here.
    contents: Union[str, bytes]
    score: float | None = None
    # crop: the region of the page this image shows, (x1, y1, x2, y2) as fractions of the page;
    # None: the whole page
    region: Optional[tuple[float, float, float, float]] = None


@dataclass(frozen=True)
class RetrieverFailure:
    kind: str  # one of FAILURE_KINDS
    message: str  # short, human and model readable


@dataclass(frozen=True)
class FetchSpec:
    modality: str  # "image" | "text"
    page: int  # 1-based, as the model sees it

    def __post_init__(self) -> None:
        if self.modality not in MODALITIES:
            raise ValueError(f"FetchSpec modality must be one of {MODALITIES}, got {self.modality!r}")
        if isinstance(self.page, bool) or not isinstance(self.page, int) or self.page < 1:
            raise ValueError(f"FetchSpec page must be an int >= 1, got {self.page!r}")

    def wire(self) -> str:
        return contract.fetch_spec(self.modality, self.page)

    @classmethod
    def parse(cls, text: str) -> "FetchSpec":
        """Inverse of `wire()` (the contract's grammar, ALDEN's "3-th" included). ValueError otherwise."""
        parsed = contract.parse_fetch_spec(text)
        if parsed is None:
            raise ValueError(f"not a fetch spec: {text!r} (expected e.g. 'image, 3' or 'text, 3')")
        return cls(*parsed)
