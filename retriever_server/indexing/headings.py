"""Which lines of a page are headings (pure).

A heading is a short line set apart from the running text: in a larger font than the page's body
text, or (nearly) entirely bold and not ending like a sentence (from the PDF text layer, see
``layout``). Pages without font information
(OCR text, image folders) fall back to "a short line alone at the top". Headings feed a separate
BM25 field, so a query naming a section scores the page that starts that section above pages
that merely mention the same words.

Invariants: headings are returned in page order, without duplicates, each a stripped line of the
page; a page whose text has no heading gives an empty tuple.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

# A heading's font is at least this much larger than the page's body font.
SIZE_RATIO = 1.12
BOLD_FRACTION = 0.9
MAX_HEADING_CHARS = 120
MAX_HEADING_WORDS = 16
MAX_HEADINGS = 12  # a page of bold lines is a list or a table, not a run of headings
# A fallback heading (no font data) that recurs on this many pages of a document is a running
# header or footer, not a heading.
RUNNING_LINE_PAGES = 3

_PAGE_NUMBER = re.compile(r"^(?:page\s+)?[0-9ivxlc]{1,6}$", re.IGNORECASE)


@dataclass(frozen=True)
class Line:
    text: str
    size: float | None = None  # dominant font size in points; None when unknown (OCR)
    bold: float = 0.0  # fraction of the line's characters set in a bold font


def _plausible(text: str) -> bool:
    letters = sum(c.isalpha() for c in text)
    return (letters >= 3 and len(text) <= MAX_HEADING_CHARS
            and len(text.split()) <= MAX_HEADING_WORDS and not _PAGE_NUMBER.match(text))


def body_size(lines: Sequence[Line]) -> float | None:
    """The font size carrying most characters on the page (None without font data)."""
    sizes: Counter[float] = Counter()
    for line in lines:
        if line.size is not None:
            sizes[round(line.size * 2) / 2] += len(line.text)
    return max(sizes, key=lambda s: (sizes[s], -s)) if sizes else None


def detect(lines: Sequence[Line]) -> tuple[str, ...]:
    """The heading lines of one page, in page order."""
    base = body_size(lines)
    if base is None:
        return _top_line(lines)
    found: list[str] = []
    for line in lines:
        text = line.text.strip()
        if not _plausible(text) or line.size is None:
            continue
        larger = line.size >= base * SIZE_RATIO
        # Bold at body size ending like a sentence is emphasis inside running text.
        bold = line.bold >= BOLD_FRACTION and not text.endswith((".", ",", ";", ")"))
        if larger or bold:
            if text not in found:
                found.append(text)
    return tuple(found) if len(found) <= MAX_HEADINGS else ()


def _top_line(lines: Sequence[Line]) -> tuple[str, ...]:
    """No font data: the first line, when it is short and followed by a blank line or more text."""
    texts = [line.text.strip() for line in lines]
    nonblank = [i for i, t in enumerate(texts) if t]
    if len(nonblank) < 2:
        return ()
    first = texts[nonblank[0]]
    if _plausible(first) and len(first.split()) <= 10 and not first.endswith((".", ",", ";")):
        return (first,)
    return ()


def drop_running_lines(per_page: Sequence[tuple[str, ...]],
                       min_pages: int = RUNNING_LINE_PAGES) -> list[tuple[str, ...]]:
    """Remove, across one document, headings that recur on ``min_pages`` or more pages.

    Digits are ignored when comparing, so "Chapter 2 - page 14" and "Chapter 2 - page 15" count as
    the same running line.
    """
    def key(text: str) -> str:
        return re.sub(r"\d+", "#", text.lower())

    counts = Counter(k for page in per_page for k in {key(h) for h in page})
    return [tuple(h for h in page if counts[key(h)] < min_pages) for page in per_page]
