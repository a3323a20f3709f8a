"""Answering requests from a loaded index, without HTTP: search, fetch, crop, and their bytes.

Imports `storage/`, `backends/` and the wire contract; never an HTTP library nor `indexing/`.

- `service`: `RetrieverService`: validate, search, fetch or crop, render the answer's bytes.
- `lifecycle`: the index a server answers from (`IndexSlot`), reloaded without dropping a request.
- `limits`: request limits and the per-item checks that turn bad items into readable reasons.
- `answer_size`: the cap on an answer's size, enforced before the work is done.
- `cache`: an LRU cache of page fragments (base64 and/or JPEG), bounded by bytes.
- `wire`: the answer's bytes, JSON or MessagePack, rendered from one answer tree.
- `regions`: crop geometry (pure): where a box falls on a page and the size its crop is drawn at.
- `cropping`: draws a crop from the page's PDF or from its stored image.
"""
