"""Tolerant readers of the values a policy writes into its actions (pure, never raise).

A policy's text is hostile input: a page number of five thousand digits (`int()` refuses more
than 4300), an integer past the float range in a box (`float()` raises OverflowError), `NaN`,
`Infinity`, a string or a nested list where a number goes. Every parser of model text reads its
numbers through these functions, which answer None for anything they cannot use, so the parser
turns it into an invalid-action observation (or a format score of 0) instead of an exception.

Values (what `json.loads` gives; the tool schemas type pages and coordinates as JSON numbers, so
a string is not one):
- `read_page(value)`: an int (not a bool) from 1 to `MAX_PAGE`, else None;
- `read_number(value)`: an int or float (not a bool) as a finite float, else None (NaN, the
  infinities, and ints past the float range included);
- `read_box(value)`: a list or tuple of four such numbers as four floats, else None.
Text (what a tags-format body holds, already cut out by the parser's pattern):
- `page_from_text(text)`: ASCII decimal digits, surrounding whitespace allowed, read as `read_page`;
- `number_from_text(text)`: an ASCII number `float()` reads, read as `read_number` (`float()` alone
  would read other scripts' digits, which no prompt teaches and the reward does not read).
And `clip(value, limit)`: a short, printable, UTF-8-encodable excerpt of anything, for an error
message (an echo of hostile text must not fill the observation budget, nor break the tokenizer).
"""

from __future__ import annotations

import math
from typing import Optional

# No document is this long; a larger page number is a mistake, and bounding it bounds the digits
# `int()` is ever asked to convert.
MAX_PAGE = 1_000_000
_MAX_PAGE_DIGITS = len(str(MAX_PAGE))
# A longer numeric text is refused before `float()` sees it: no coordinate needs more, and it
# bounds the work a hostile number costs.
_MAX_NUMBER_CHARS = 64


def read_page(value: object) -> Optional[int]:
    """A 1-based page number within 1..MAX_PAGE, or None."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_PAGE:
        return value
    return None


def read_number(value: object) -> Optional[float]:
    """A finite float, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past the float range (~1.8e308) does not become inf: it raises
        return None
    return number if math.isfinite(number) else None


def read_box(value: object) -> Optional[tuple[float, float, float, float]]:
    """Four finite numbers [x1, y1, x2, y2] as floats, or None."""
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        return None
    x1, y1, x2, y2 = (read_number(v) for v in value)
    if x1 is None or y1 is None or x2 is None or y2 is None:
        return None
    return x1, y1, x2, y2


def page_from_text(text: str) -> Optional[int]:
    """A page number written as decimal digits, or None."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdecimal()) or len(digits) > _MAX_PAGE_DIGITS:  # "٣" is no page 3
        return None
    return read_page(int(digits))


def number_from_text(text: str) -> Optional[float]:
    """A finite number written as text, or None."""
    if len(text) > _MAX_NUMBER_CHARS or not text.isascii():
        return None
    try:
        return read_number(float(text))
    except ValueError:
        return None


def clip(value: object, limit: int = 40) -> str:
    """`value` as a one-line excerpt of at most about `limit` characters (repr of non-strings)."""
    try:
        text = value if isinstance(value, str) else repr(value)
    except (RecursionError, ValueError):  # a list nested too deep to print; an int too long for str()
        text = f"<{type(value).__name__}>"
    text = " ".join(text[: 4 * limit].split())
    if len(text) > limit:
        text = text[:limit] + "..."
    return text.encode("utf-8", "replace").decode("utf-8")  # lone surrogates (JSON escapes) become "?"
