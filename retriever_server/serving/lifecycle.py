"""The index a running server answers from, replaceable without dropping a request.

Invariant: ``IndexSlot.current`` always names one fully loaded index. A reload builds the new
backend, cache and service completely, off to the side, then replaces the reference in one
assignment; a request reads ``current`` once when it starts and finishes on that index even if a
reload lands meanwhile (the old objects live until their last request drops them). Every answer
carries the version of the index that produced it (``X-Index-Version``).

The version is the first 16 hex digits of the SHA-256 of the manifest (of every backend built
on a ``PageStore``: BM25, Qdrant, hybrid), so two builds of the same sources with the same
settings have the same version, and any change of pages, text, settings or encoder changes it.

Threads: requests read ``current`` (one reference read, no lock). ``current`` is assigned only
under ``_reload_lock``, by ``reload`` (``POST /admin/reload``, a request thread) or by the
follow thread, which re-checks under that lock that the path still names another directory, so
any number of follow checks seeing one re-index load it once. See docs/retriever.md,
*Concurrency model*.

Re-indexing over the served path (``vrag-retriever index ... --out PATH``) leaves the served
directory in place, moved aside, while this process reads it (``storage/swap.py``), so answers
stay complete and consistent until ``reload`` switches to the new index.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

from ..backends import Backend, open_backend
from ..backends.bm25 import Bm25Backend
from ..storage.store import PageStore
from ..storage.swap import collect, recover
from .cache import PRELOAD_FORMS, FragmentCache
from .limits import Limits
from .service import RetrieverService

VERSION_HEADER = "X-Index-Version"
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedIndex:
    service: RetrieverService
    version: str
    path: str | None  # None for an in-memory backend handed to create_app
    backend_name: str
    documents: int
    pages: int
    inode: int | None = None  # of the directory at ``path`` when it was loaded


def _as_backend(source) -> tuple[Backend, str | None]:
    if isinstance(source, Backend):
        return source, None
    if isinstance(source, PageStore):
        return Bm25Backend.from_store(source), str(source.root)
    if isinstance(source, (str, PathLike)):
        recover(Path(source))  # a re-index swap a crash interrupted is finished or undone first
        return open_backend(source), str(Path(source).absolute())
    raise TypeError(f"create_app needs an index dir, a PageStore or a Backend, got {type(source)}")


def index_version(backend: Backend) -> str:
    """Content version of what ``backend`` serves: its manifest's hash, if it has one."""
    store = getattr(backend, "store", None)
    manifest = getattr(store, "manifest", None)
    if manifest is not None:
        return hashlib.sha256(manifest.to_json().encode()).hexdigest()[:16]
    docs = sorted(backend.documents().items())
    return hashlib.sha256(repr((backend.name, docs)).encode()).hexdigest()[:16]


class IndexSlot:
    """``follow_s``: when set, a request notices (at most every ``follow_s`` seconds, one
    ``stat``) that the served path now names another directory (a re-index swapped one in) and
    starts a reload in the background; that request and those until the switch are still
    answered from the loaded index. This is how every ``--workers`` process picks up a re-index."""

    def __init__(self, source, *, limits: Limits, cache_bytes: int, preload: bool | str,
                 on_load: Callable[[LoadedIndex], None] = lambda loaded: None,
                 follow_s: float | None = None):
        self._limits, self._cache_bytes, self._preload = limits, cache_bytes, preload
        self._on_load = on_load
        self._reload_lock = threading.Lock()  # one reload at a time; requests never take it
        self._follow_s, self._next_check, self._check_lock = follow_s, 0.0, threading.Lock()
        self.current = self._load(source)
        on_load(self.current)

    def follow(self) -> LoadedIndex:
        """``current``, after starting a background reload if the path changed (``follow_s``)."""
        loaded = self.current
        if self._follow_s is None or loaded.path is None:
            return loaded
        now = time.monotonic()
        with self._check_lock:
            if now < self._next_check:
                return loaded
            self._next_check = now + self._follow_s
        if _moved(loaded) and not self._reload_lock.locked():
            threading.Thread(target=self._follow_quietly, name="index-follow", daemon=True).start()
        return loaded

    def _follow_quietly(self) -> None:
        try:
            with self._reload_lock:
                # Another follow thread, or a POST /admin/reload, may have loaded it meanwhile.
                if not _moved(self.current):
                    return
                loaded = self._switch(self.current.path)
            _collect_quietly(loaded.path)
        except Exception:  # noqa: BLE001 - keep serving the loaded index; retried on a later check
            _log.exception("reloading the re-indexed %s failed; still serving %s",
                           self.current.path, self.current.version)

    def _load(self, source) -> LoadedIndex:
        backend, path = _as_backend(source)
        cache = FragmentCache(backend, self._cache_bytes)
        if self._preload:  # True: the rollout client's form; else a key of PRELOAD_FORMS
            cache.warm(PRELOAD_FORMS["msgpack" if self._preload is True else self._preload])
        service = RetrieverService(backend, cache, self._limits)
        docs = service.documents
        store = getattr(backend, "store", None)
        inode = store.inode if isinstance(store, PageStore) else None
        return LoadedIndex(service, index_version(backend), path, backend.name, len(docs),
                           sum(docs.values()), inode)

    def reload(self, path: str | PathLike | None = None) -> LoadedIndex:
        """Load the index at ``path`` (default: the path served now) and switch to it.

        Raises (and keeps serving the current index) when the new one cannot be opened.
        """
        with self._reload_lock:
            target = path if path is not None else self.current.path
            if target is None:
                raise ValueError("this server was started from an in-memory backend; name an "
                                 "index directory to load")
            loaded = self._switch(target)
        _collect_quietly(loaded.path)
        return loaded

    def _switch(self, target) -> LoadedIndex:
        # Call with _reload_lock held.
        loaded = self._load(Path(target))
        self.current = loaded  # the switch: one reference assignment
        self._on_load(loaded)
        return loaded


def _moved(loaded: LoadedIndex) -> bool:
    """True when the path ``loaded`` was loaded from now names another directory."""
    if loaded.path is None:
        return False
    try:
        return os.stat(loaded.path).st_ino != loaded.inode
    except OSError:
        return False  # mid-swap (recovery happens on reload): keep serving what we have


def _collect_quietly(path: str) -> None:
    # The previous index's files are deleted once its last request is done with them (its
    # store's lock goes with it); those still in use are collected on a later reload. The switch
    # has happened: a failure here is only logged, never reported as a failed reload.
    try:
        collect(Path(path))
    except OSError:
        _log.warning("could not delete old copies beside %s", path, exc_info=True)
