"""OCR through the tesseract command-line tool, when it is installed.

We call the binary directly instead of adding a Python wrapper dependency: one subprocess per
page, text on stdout.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import tempfile
from pathlib import Path

from PIL import Image

# Pages whose text layer has fewer non-space characters than this are treated as scans.
MIN_TEXT_CHARS = 20


def tesseract_path() -> str | None:
    return shutil.which("tesseract")


def needs_ocr(text: str) -> bool:
    # Stop counting at the threshold: full pages have thousands of characters.
    visible = (c for c in text if not c.isspace())
    return sum(1 for _ in itertools.islice(visible, MIN_TEXT_CHARS)) < MIN_TEXT_CHARS


def ocr_image(image: Image.Image, *, lang: str = "eng", timeout_s: float = 120.0) -> str:
    """Text of ``image`` via tesseract; raises RuntimeError when tesseract is missing or fails."""
    exe = tesseract_path()
    if exe is None:
        raise RuntimeError("tesseract is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "page.png"
        image.convert("L").save(src)
        proc = subprocess.run([exe, str(src), "stdout", "-l", lang], capture_output=True,
                              timeout=timeout_s, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"tesseract failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode("utf-8", errors="replace").strip()
