"""Which document a tool call reads: the row's own, or in corpus scope the current document (pure).

A row with a `doc_id` is in document scope (ALDEN's setting): every search, fetch and crop reads
that document. A row without one is in corpus scope (VRAG-RL's): a search ranks the pages of the
whole index, and a fetch or a crop reads a page of the *current document*, the document of the
last page the episode was shown (a search hit, a fetched page or a crop; the last of a result's
pages, in the order the observation shows them: a tool turn answers its calls in call order), as
it stands when the turn starts (a turn's calls run together: a fetch cannot read the
document its own turn's search finds). Before any page is shown there is none, and a fetch is
answered as the policy's mistake (`NO_CURRENT_DOCUMENT`).

The grammar is the same in both scopes (`<fetch>image, 3</fetch>`, `<crop>3, [box]</crop>`,
`<bbox>[box]</bbox>` and the native tools' arguments): a policy moves between them unchanged,
and an observation keeps the token layout the batch checks prove (no text is added to a result).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from .actions import Search
from .regions import RegionRequest

NO_CURRENT_DOCUMENT = ("no page has been shown yet: search first (a fetch reads a page of the document "
                       "of the last page shown)")


def document_of(page_id: str) -> str:
    """The document of a page id `"<doc>_<page>"` (a doc id may hold underscores itself)."""
    return page_id.rpartition("_")[0]


def current_document(doc_id: Optional[str], page_ids: Sequence[Sequence[str]]) -> Optional[str]:
    """The document a fetch reads: `doc_id` (document scope), else the document of the last page
    shown (`page_ids`: per observation, its pages in the order it shows them), else None."""
    if doc_id is not None:
        return doc_id
    for shown in reversed(page_ids):
        if shown:
            return document_of(shown[-1])
    return None


def call_document(action: Any, doc_id: Optional[str], page_ids: Sequence[Sequence[str]]) -> Optional[str]:
    """The document a resolved call reads: a search its row's (None: the whole corpus), a region
    request the document of the page it crops, a fetch the current document."""
    if isinstance(action, Search):
        return doc_id
    if isinstance(action, RegionRequest):
        return document_of(action.page_id)
    return current_document(doc_id, page_ids)
