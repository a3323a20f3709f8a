"""Documents that cannot be read during a build: left out, recorded, or the build stopped.

Contract:

- `MODES`: what `build_index(unreadable=...)` does with a document that raises
  `ingest.UnreadableDocument` (a corrupt or encrypted PDF, an empty one, a page image PIL cannot
  decode): `skip` (the default) leaves it out, goes on and records it; `fail` stops the build at
  the first, which then writes nothing.
- `skipped_entry(source, reason)`: how the manifest records one (`Manifest.skipped`, in discovery
  order): `{"source": the path given or found, "reason": why, without the path}`.
- `drop(pages, docs, build_dir, failed)`: a build's pages and documents without the documents in
  `failed` (doc ids), whose page images and PDF copy are deleted; the rows of the documents after
  them move down to stay contiguous from 0, their page images renamed to match. Needed because
  rows are assigned before any page is read, and an image folder (or a PDF page) can fail late.
- `nothing_indexed(skipped)`: the error when no document could be read: it names each.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from ..storage.manifest import DocEntry, PageEntry, image_name

MODES = ("skip", "fail")


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unreadable must be one of {', '.join(MODES)}, got {mode!r}")


def skipped_entry(source: Path | str, reason: str) -> dict:
    return {"source": str(source), "reason": reason}


def drop(pages: list[PageEntry], docs: list[DocEntry], build_dir: Path,
         failed: set[str]) -> tuple[list[PageEntry], list[DocEntry]]:
    kept_pages: list[PageEntry] = []
    kept_docs: list[DocEntry] = []
    by_doc: dict[str, list[PageEntry]] = {}
    for entry in pages:
        by_doc.setdefault(entry.doc_id, []).append(entry)
    for doc in docs:  # in row order, so each rename moves a page down onto a freed name
        if doc.doc_id in failed:
            for row in range(doc.first_row, doc.first_row + doc.num_pages):  # some may not exist
                (build_dir / image_name(row)).unlink(missing_ok=True)
            if doc.pdf is not None:
                (build_dir / doc.pdf).unlink(missing_ok=True)
            continue
        first_row = len(kept_pages)
        for offset, entry in enumerate(by_doc[doc.doc_id]):
            name = image_name(first_row + offset)
            if name != entry.image:
                os.replace(build_dir / entry.image, build_dir / name)
                entry = replace(entry, image=name)
            kept_pages.append(entry)
        kept_docs.append(replace(doc, first_row=first_row))
    return kept_pages, kept_docs


def nothing_indexed(skipped: list[dict]) -> ValueError:
    named = "; ".join(f"{s['source']}: {s['reason']}" for s in skipped)
    return ValueError(f"nothing could be indexed: no document could be read ({named})")
