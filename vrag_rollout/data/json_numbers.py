"""JSON read with every number's own text kept (pure).

An answer written `3.50` in a dataset must reach the reward as "3.50", not as the float 3.5:
`loads(text)` is `json.loads` whose fractional and exponent numbers are `SourceNumber`s (floats
that remember their text); `number_text(value)` gives a number's source text (integers as
written), or None for a non-finite number or anything that is not a number.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional


class SourceNumber(float):
    """A JSON number with a fraction or exponent, remembering its source text."""

    text: str

    def __new__(cls, text: str) -> "SourceNumber":
        number = super().__new__(cls, text)
        number.text = text
        return number


def loads(text: str) -> Any:
    return json.loads(text, parse_float=SourceNumber)


def number_text(value: Any) -> Optional[str]:
    if isinstance(value, bool):
        return None
    if isinstance(value, SourceNumber):
        return value.text if math.isfinite(value) else None
    if isinstance(value, int):
        return str(value)
    return None
