"""Readable answers to requests FastAPI cannot read (its ``RequestValidationError``).

Contract: `describe(exc, content_type)` -> (status, detail), the detail saying what to send:

- a body not sent as JSON (FastAPI then hands the validator the raw bytes: curl ``-d`` without
  ``-H`` sends ``application/x-www-form-urlencoded``) -> ``415``, naming the content type it got
  and the header to send, and where MessagePack belongs (``Accept``: answers only);
- malformed JSON -> ``422`` ``malformed JSON in the request body at line L, column C
  (character N): <what the parser expected>``; FastAPI reports only the character offset, as a
  location (``body.41``) that reads like a field path;
- anything else (wrong types, missing fields) -> ``422`` with the first few field errors, each as
  ``body.<field path>: <message>``.
"""

from __future__ import annotations

from fastapi.exceptions import RequestValidationError

from .. import contract

SCHEMA_HINT = "(the request schema is at GET /docs)"
_MAX_ERRORS = 5


def _position(doc: str, offset: int) -> str:
    line = doc.count("\n", 0, offset) + 1
    column = offset - (doc.rfind("\n", 0, offset) + 1) + 1
    return f"line {line}, column {column} (character {offset})"


def describe(exc: RequestValidationError, content_type: str | None) -> tuple[int, str]:
    errors = exc.errors()
    if isinstance(exc.body, (bytes, bytearray)):
        # FastAPI parses a body as JSON only when its content type is JSON (or absent).
        return 415, (f"the request body was sent as {content_type!r}, which this server does not "
                     f"read: send it as JSON with the header 'content-type: {contract.JSON}' "
                     f"(curl: -H 'content-type: {contract.JSON}'). MessagePack is for answers "
                     f"only: ask for one with 'accept: {contract.MSGPACK}'")
    for error in errors:
        if error.get("type") == "json_invalid" and isinstance(exc.body, str):
            offset = error["loc"][-1]
            reason = (error.get("ctx") or {}).get("error", "cannot be parsed")
            return 422, (f"malformed JSON in the request body at {_position(exc.body, offset)}: "
                         f"{reason} {SCHEMA_HINT}")
    summary = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}"
                        for e in errors[:_MAX_ERRORS])
    return 422, f"invalid request: {summary} {SCHEMA_HINT}"
