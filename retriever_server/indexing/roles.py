"""What a page is, from its own text: a table of contents, an index, front matter, or body.

Pure functions over a page's text lines (plus where the page sits in its document). The roles
exist for ranking: contents and index pages repeat section titles and terms word for word, so
plain BM25 ranks them above the page that actually holds the section (see ``backends.bm25``).

Signals (no dictionary of titles, nothing learned):

- *reference lines*: a line that ends in a page reference, i.e. dotted leaders (``Voxel grids
  . . . . 23``), a title followed by a page number (``Canvas size 32``), or a comma list of pages
  (``pm3d, 64, 141, 188``). A page whose lines are mostly reference lines is a list page.
- a list page is an *index* when it reads like one: comma page lists, single-letter group
  headings (``P``), entries in alphabetical order, or the word "index" at the top; otherwise it is
  *contents* (numbered or unordered section titles).
- *front matter*: one of the first pages of a document that carries a copyright / licence /
  ISBN notice, or a title page with very little text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

BODY, CONTENTS, INDEX, FRONT = "body", "contents", "index", "front"

# A page reference: an arabic number, or a lower-case roman one (front-matter pages: i .. xxxix).
_PAGE = re.compile(r"[0-9]{1,4}|x{0,3}(?:ix|iv|v?i{0,3})")
_RANGE = re.compile(r"[0-9]{1,4}(?:\s*[-\u2013]\s*[0-9]{1,4})?")
# Dotted leaders at the end of a line, before an optional page reference.
_LEADER = re.compile(r"(?:\.\s*){4,}$")
# A section number in front of a title: "2.3 ", "A.1 ", "Appendix B: ", "Chapter 4 ".
_NUMBER_PREFIX = re.compile(r"^(?:\d+(?:\.\d+)*\.?|[A-Z](?:\.\d+)+|appendix\s+[a-z0-9]+:?|"
                            r"chapter\s+\d+:?|part\s+[ivx0-9]+)\s+(?=\S)", re.IGNORECASE)
_GROUP_LETTER = re.compile(r"^(?:[A-Z]|Symbols|Numbers|Numerics)$")
_FRONT_WORDS = re.compile(r"copyright|\(c\)|©|all rights reserved|permission is granted|isbn|"
                          r"published by|licen[cs]e", re.IGNORECASE)
_CONTENTS_TITLE = re.compile(r"^(?:table of )?contents\b", re.IGNORECASE)
_INDEX_TITLE = re.compile(r"\bindex\b", re.IGNORECASE)

MIN_LIST_LINES = 5
LIST_FRACTION = 0.5
FRONT_PAGES = 6  # front matter can only be among a document's first pages
TITLE_PAGE_WORDS = 40


def _page_list(line: str) -> bool:
    """"term, 12, 40-42, 77": an index entry with its page list."""
    term, *refs = line.split(",")
    return (bool(refs) and any(c.isalpha() for c in term)
            and all(_RANGE.fullmatch(r.strip()) for r in refs))


def _is_reference(line: str) -> bool:
    """Does the line end in a page reference (leaders, "Title 32", or a page list)?"""
    head, _, last = line.rpartition(" ")
    if not (last and (last[-1].isdigit() or last[-1] in "ivx.")):
        return False  # cheap exit for ordinary lines, which end in a letter or punctuation
    if _PAGE.fullmatch(last):
        if _LEADER.search(head) or _page_list(line):
            return True
        # Mostly letters before the number: "Canvas size 32", not "x = 3 * 4 + 12".
        letters = sum(c.isalpha() for c in head)
        return letters >= 3 and letters >= 0.6 * len(head.replace(" ", ""))
    return bool(_LEADER.search(line))


def _strip_reference(line: str) -> str:
    head, _, last = line.rpartition(" ")
    text = head if _PAGE.fullmatch(last) else line
    return _LEADER.sub("", text).rstrip(" ,")


def _entry_text(line: str) -> str:
    """An entry's words without leaders, page numbers and section numbers (lower-cased)."""
    text = line.split(",")[0] if _page_list(line) else _strip_reference(line)
    text = _NUMBER_PREFIX.sub("", text)
    return text.strip().lower()


def _alphabetical_fraction(entries: list[str]) -> float:
    keys = [e[0] for e in entries if e and e[0].isalpha()]
    if len(keys) < 2:
        return 0.0
    return sum(a <= b for a, b in zip(keys, keys[1:])) / (len(keys) - 1)


def classify(lines: Sequence[str], page: int, num_pages: int) -> str:
    """The role of a page (``BODY``, ``CONTENTS``, ``INDEX`` or ``FRONT``) from its text lines;
    ``page`` is 1-based."""
    lines = [line.strip() for line in lines if line.strip()]
    top = [line.lower() for line in lines[:3]]
    refs = [line for line in lines if _is_reference(line)]
    if len(refs) >= MIN_LIST_LINES and len(refs) >= LIST_FRACTION * len(lines):
        return _list_kind(lines, refs, top)
    if page <= min(FRONT_PAGES, max(1, num_pages // 4)):
        words = sum(len(line.split()) for line in lines)
        if any(_FRONT_WORDS.search(line) for line in lines) or words <= TITLE_PAGE_WORDS:
            return FRONT
    return BODY


def _list_kind(lines: list[str], refs: list[str], top: list[str]) -> str:
    if any(_CONTENTS_TITLE.search(t) for t in top):
        return CONTENTS
    page_lists = sum(_page_list(r) for r in refs)
    letters = sum(bool(_GROUP_LETTER.match(line)) for line in lines)
    numbered = sum(bool(_NUMBER_PREFIX.match(r)) for r in refs)
    ordered = _alphabetical_fraction([_entry_text(r) for r in refs])
    if any(_INDEX_TITLE.search(t) for t in top) and numbered < 0.3 * len(refs):
        return INDEX
    if page_lists >= 0.3 * len(refs) or letters >= 2:
        return INDEX
    if ordered >= 0.85 and numbered < 0.2 * len(refs):
        return INDEX
    return CONTENTS
