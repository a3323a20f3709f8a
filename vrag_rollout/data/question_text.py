"""A questions file's text, or a message that says what the file is instead.

Contract: `question_text(path)` returns the file decoded as UTF-8 (a leading BOM dropped: files
saved on Windows often start with one), or raises `QuestionFileError` (a ValueError) naming what
was given instead: a PDF (a document, which `vrag-retriever index` reads), a parquet file (a
converted dataset, which `--data` reads), or bytes that are not UTF-8 text. Every reader of a
questions file reads it through here, so a wrong file gets one clear answer, not a codec error.
"""

from __future__ import annotations

from pathlib import Path


class QuestionFileError(ValueError):
    """The file is not a questions file (the message says what it is and what to do)."""


def question_text(path: Path) -> str:
    data = Path(path).read_bytes()
    if data.startswith(b"%PDF"):
        raise QuestionFileError("this is a PDF, a document, not a questions file: index documents with "
                                "`vrag-retriever index DIR --out INDEX`, and convert a JSON or JSON Lines file of "
                                "questions about them (docs/datasets.md; examples/questions.json is one)")
    if data.startswith(b"PAR1"):
        raise QuestionFileError("this is a parquet file, already a converted dataset: pass it to --data of "
                                "rollout, evaluate or learn instead of converting it again")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise QuestionFileError(f"not UTF-8 text (byte {error.start}): a questions file is a JSON array or JSON "
                                "Lines, saved as UTF-8") from None
