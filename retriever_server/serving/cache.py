"""An LRU cache of page fragments (the image as base64 and/or JPEG bytes, plus item framing),
bounded by bytes.

Serving reads pages from here; a miss reads the JPEG once from the backend and keeps it in the
form asked for only, so a server whose clients all speak one format holds each page once. A
page asked for in the other form too gains it (derived from the first, counted in the bytes).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from .. import contract
from ..backends.base import Backend
from .wire import PageFragment, make_fragment

DEFAULT_CACHE_BYTES = 2 * 1024**3
# ``serve --preload FORM``: the answer format whose pages are loaded at start-up.
PRELOAD_FORMS = {"msgpack": contract.MSGPACK, "json": contract.JSON}


class FragmentCache:
    def __init__(self, backend: Backend, max_bytes: int = DEFAULT_CACHE_BYTES):
        self._backend = backend
        self._max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, int], PageFragment] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, doc_id: str, page: int, form: str) -> PageFragment:
        """The page's fragment, holding its image in ``form`` (``contract.JSON``: base64;
        ``contract.MSGPACK``: JPEG bytes)."""
        key = (doc_id, page)
        with self._lock:
            fragment = self._items.get(key)
            if fragment is not None:
                self._items.move_to_end(key)
                if fragment.has(form):
                    return fragment
        # Read and encode outside the lock; two threads may both do it for a cold page, which
        # is harmless: the first to come back is kept.
        if fragment is None:
            image = self._backend.page_image(doc_id, page)
            made = make_fragment(doc_id, page, image.jpeg, image.mime,
                                 dict(self._backend.page_info(doc_id, page)), form)
            with self._lock:
                fragment = self._items.setdefault(key, made)
                if fragment is made:
                    self._grow(made.nbytes)
                if fragment.has(form):
                    return fragment
        image = fragment.derive(form)
        with self._lock:
            added = fragment.adopt(form, image)
            if self._items.get(key) is fragment:  # an evicted fragment is no longer counted
                self._grow(added)
        return fragment

    def _grow(self, added: int) -> None:
        # Call with the lock held.
        self._bytes += added
        while self._bytes > self._max_bytes and len(self._items) > 1:
            _, old = self._items.popitem(last=False)
            self._bytes -= old.nbytes

    def warm(self, form: str) -> int:
        """Load every page (in index order) in ``form`` until the cache is full; returns pages
        loaded."""
        loaded = 0
        for doc_id, count in self._backend.documents().items():
            for page in range(1, count + 1):
                if self._bytes >= self._max_bytes:
                    return loaded
                self.get(doc_id, page, form)
                loaded += 1
        return loaded

    @property
    def nbytes(self) -> int:
        return self._bytes
