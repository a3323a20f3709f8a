"""Page entries: one shared, content-addressed copy of each distinct page a batch shows.

A retrieved page is its encoded bytes. `PageEntry` is the dict `{"bytes": ...}` that EasyR1's
`process_image` reads (Hugging Face datasets' Image feature writes the same), immutable, plus
`key`, a digest of those bytes, and `image`, the pixels decoded once, on first use. Every sample and turn
that shows a page holds the same entry, so a batch holds each distinct page once, and pickling
the batch (Ray's hand-off to the workers, a saved batch) writes each page's bytes once: pickle
shares repeated objects, and an entry pickles as its bytes, never its pixels.

Invariant: an entry's pixels are what any reader gets from its bytes: `Image.open(bytes)` then
`convert("RGB")`, as the trainers' readers do. `vision.decode_page_file` keeps the retriever's
own bytes only when the page it shows the engine is exactly that (no resize, no transparency);
otherwise the entry holds a lossless PNG of the page as shown.

`PageCache` maps the retriever's content to the page's entry, so a page served again (the n
samples of a group, later turns) is decoded once. It holds entries weakly: an entry lives as long
as an episode or a batch holds it.
"""

from __future__ import annotations

import hashlib
import io
import threading
import weakref
from typing import Any, Callable, Hashable, Optional

from PIL import Image


def content_key(data: bytes | str) -> str:
    """A digest of encoded content (bytes, or base64 text as served)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)  # any text: never raises
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def png_bytes(image: Image.Image) -> bytes:
    """Lossless bytes of an RGB image (fast zlib level: these are written once per page)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def _decode(data: bytes) -> Image.Image:
    """The trainers' reading of image bytes: open, load, RGB."""
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        return image if image.mode == "RGB" else image.convert("RGB")


class PageEntry(dict):
    """{"bytes": encoded page} with its content `key` and its lazily decoded, cached `image`.

    Pickles (and copies) as its bytes alone. Equal entries have equal bytes; two entries are
    the same page exactly when their keys are equal.
    """

    def __init__(self, data: bytes, image: Optional[Image.Image] = None, key: Optional[str] = None):
        if not isinstance(data, (bytes, bytearray, memoryview)) or not len(data):
            raise ValueError(f"a page entry holds encoded image bytes, got {type(data).__name__}")
        super().__init__(bytes=bytes(data))
        self.key = key or content_key(self["bytes"])
        self._image = image
        self._lock = threading.Lock()

    @classmethod
    def of_image(cls, image: Image.Image) -> "PageEntry":
        """An entry for pixels that have no encoded form of their own (lossless PNG)."""
        rgb = image if image.mode == "RGB" else image.convert("RGB")
        return cls(png_bytes(rgb), image=rgb)

    @property
    def image(self) -> Image.Image:
        """The page's RGB pixels, decoded on first use (once per process and entry)."""
        with self._lock:
            if self._image is None:
                self._image = _decode(self["bytes"])
            return self._image

    @property
    def size(self) -> tuple[int, int]:
        """(width, height), from the decoded page or the file's header (no pixels decoded)."""
        if self._image is not None:
            return self._image.size
        with Image.open(io.BytesIO(self["bytes"])) as image:
            return image.size

    @property
    def width(self) -> int:
        return self.size[0]

    @property
    def height(self) -> int:
        return self.size[1]

    def __reduce__(self) -> tuple:
        return PageEntry, (self["bytes"], None, self.key)

    def __deepcopy__(self, memo: dict) -> "PageEntry":
        return self  # immutable content: a copy would only duplicate the page

    def _immutable(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a page entry is immutable: its key is the digest of its bytes")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = __ior__ = _immutable

    def __repr__(self) -> str:
        return f"PageEntry(key={self.key[:12]}, {len(self['bytes'])} bytes)"


def pixels(entry: Any) -> Any:
    """What an image processor takes for one `multi_modal_data` image: a page entry's decoded
    image, anything else (a PIL image, the prompt's own entries) as it is."""
    return entry.image if isinstance(entry, PageEntry) else entry


class PageCache:
    """Served content -> the page's entry, shared by every episode that is shown it; thread-safe.

    An entry is found by the served content's key and, once decoded, by its own key too: two
    answers that differ as served (another encoding of the same page, another size that resizes
    to the same pixels) still share one entry. Entries are held weakly, so an entry stays found
    exactly as long as something holds it (an episode, a batch): the cache never keeps a page
    alive by itself and needs no size limit and no clearing between batches.
    """

    def __init__(self) -> None:
        self._served: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._entries: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # by entry key
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0  # pages decoded

    def get(self, key: Hashable, decode: Callable[[], Optional[PageEntry]]) -> Optional[PageEntry]:
        """The entry served as `key`, else `decode()`'s (None: undecodable, never cached). Two
        threads decoding one new page at once both decode it; both get the first one kept."""
        with self._lock:
            entry = self._served.get(key)
            if entry is not None:
                self.hits += 1
                return entry
        entry = decode()
        if entry is None:
            return None
        with self._lock:
            self.misses += 1
            kept = self._entries.setdefault(entry.key, entry)
            self._served[key] = kept
            return kept

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
