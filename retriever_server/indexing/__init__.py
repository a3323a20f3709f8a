"""Building an index: documents in, an index directory (`storage/`) out, written atomically.

Imports `storage/`, `backends/` (to build BM25 and Qdrant) and `encoders/`; never serving or HTTP.

- `indexer`: `build_index`: discover, extract, rank pages, write BM25, manifest; swap in.
- `ingest`: sources (PDFs, folders of PDFs or page images) -> documents -> pages (text, JPEG).
- `unreadable`: documents that cannot be read: left out and recorded (or the build stopped).
- `ocr`: OCR through the tesseract command, for pages without a usable text layer.
- `layout`: the lines of a PDF page's text layer with font size and boldness (pdfium).
- `headings`: which lines of a page are headings (pure).
- `roles`: what a page is from its text: contents, index, front matter or body (pure).
- `dense_index`: the index-time dense options, and encoding pages into Qdrant.
- `suggest`: commands that error messages suggest (where to index, what to run), run as printed.
"""
