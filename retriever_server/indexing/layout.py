"""Lines of a PDF page's text layer with their font size and boldness (pdfium, read-only).

The only I/O half of heading detection: it turns a pdfium text page into ``headings.Line``s;
what counts as a heading is decided in ``headings`` (pure). Lines are split where pdfium puts
its line breaks, i.e. the same lines as ``get_text_range()``.
"""

from __future__ import annotations

import ctypes
from collections import Counter

import pypdfium2.raw as pdfium_c

from .headings import Line

# pdfium reports font weight 100..900 (400 regular, 700 bold); TeX's bold fonts say ~550.
BOLD_WEIGHT = 500
_BOLD_NAMES = ("bold", "black", "heavy", "semibold", "cmbx", "-bd")


def _bold_by_name(textpage, index: int, buf) -> bool:
    flags = ctypes.c_int()
    pdfium_c.FPDFText_GetFontInfo(textpage, index, buf, len(buf), ctypes.byref(flags))
    name = buf.value.decode("latin-1").lower()
    return any(marker in name for marker in _BOLD_NAMES)


# Characters whose font is looked up per line: a line's size and boldness are read from an even
# sample of its characters (one ctypes call per character was most of the ingest time).
SAMPLES_PER_LINE = 16


def _style(raw, index: int, buf) -> tuple[float, bool]:
    weight = pdfium_c.FPDFText_GetFontWeight(raw, index)
    bold = weight >= BOLD_WEIGHT or (weight < 0 and _bold_by_name(raw, index, buf))
    return round(pdfium_c.FPDFText_GetFontSize(raw, index), 1), bold


def page_lines(textpage) -> list[Line]:
    """``Line``s of a ``pypdfium2.PdfTextPage``, in reading order."""
    raw = textpage.raw
    text = textpage.get_text_range()
    if len(text) != pdfium_c.FPDFText_CountChars(raw):
        # Characters outside the BMP make text offsets differ from pdfium's char indices.
        return [Line(line.strip()) for line in text.splitlines() if line.strip()]
    buf = ctypes.create_string_buffer(128)
    lines: list[Line] = []
    start = 0
    for end in [i for i, ch in enumerate(text) if ch == "\n"] + [len(text)]:
        visible = [i for i in range(start, end) if not text[i].isspace()]
        line = text[start:end].strip()
        start = end + 1
        if not line:
            continue
        step = max(1, len(visible) // SAMPLES_PER_LINE)
        styles = [_style(raw, i, buf) for i in visible[::step][:SAMPLES_PER_LINE]]
        sizes = Counter(size for size, _ in styles)
        size = max(sizes, key=lambda s: (sizes[s], s))
        lines.append(Line(line, size, sum(bold for _, bold in styles) / len(styles)))
    return lines
