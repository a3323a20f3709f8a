"""An LRU cache of page fragments (base64 JPEG + JSON framing), bounded by bytes.

Serving reads pages from here; a miss reads the JPEG once from the backend and encodes it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from .backends.base import Backend
from .wire import PageFragment, make_fragment

DEFAULT_CACHE_BYTES = 2 * 1024**3


class FragmentCache:
    def __init__(self, backend: Backend, max_bytes: int = DEFAULT_CACHE_BYTES):
        self._backend = backend
        self._max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, int], PageFragment] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, doc_id: str, page: int) -> PageFragment:
        key = (doc_id, page)
        with self._lock:
            fragment = self._items.get(key)
            if fragment is not None:
                self._items.move_to_end(key)
                return fragment
        # Encode outside the lock; two threads may both encode a cold page, which is harmless.
        image = self._backend.page_image(doc_id, page)
        fragment = make_fragment(doc_id, page, image.jpeg, image.mime,
                                 dict(self._backend.page_info(doc_id, page)))
        with self._lock:
            if key not in self._items:
                self._items[key] = fragment
                self._bytes += fragment.nbytes
                while self._bytes > self._max_bytes and len(self._items) > 1:
                    _, old = self._items.popitem(last=False)
                    self._bytes -= old.nbytes
        return fragment

    def warm(self) -> int:
        """Load every page (in index order) until the cache is full; returns pages loaded."""
        loaded = 0
        for doc_id, count in self._backend.documents().items():
            for page in range(1, count + 1):
                if self._bytes >= self._max_bytes:
                    return loaded
                self.get(doc_id, page)
                loaded += 1
        return loaded

    @property
    def nbytes(self) -> int:
        return self._bytes
