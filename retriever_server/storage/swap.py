"""Crash-safe replacement of an index directory, and recovery after a crash.

Names, all in the parent directory of ``OUT``:

- ``OUT``: the index served under that path;
- ``.OUT.building-*``: a build in progress (its builder holds a shared ``flock`` on it);
- ``.OUT.old-*``: a previous index moved aside by a swap.

Swap (under an exclusive ``flock`` on the parent directory): the build is complete (its manifest
is written last); rename ``OUT`` to ``.OUT.old-*``; rename the build to ``OUT``; delete the old
directory unless a server still reads it (servers hold a shared ``flock`` on the directory they
serve, see ``store.PageStore``), in which case it stays until a later ``collect``.

Invariant: after a ``kill -9`` at any instant, ``OUT`` is a complete index (old or new), or
``OUT`` is missing and ``recover(OUT)`` (run by ``index`` and ``serve`` before anything else)
completes the swap with the finished build or rolls back to the old index. Recovery also
deletes builds and old directories that nobody holds.

Concurrency: every rename and every deletion of these names happens under the parent lock, and
a directory is deleted only when nobody holds a lock on it. So a build is created and claimed
under the parent lock (else a collect could delete it in between), and a reader takes its
shared lock first and then checks that the name still refers to what it locked (else a swap
could have moved the directory aside and deleted it in between). The one deletion outside the
parent lock is a builder removing its own failed build, which ``_siblings`` tolerates.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .manifest import read_manifest

_BUILDING = ".building-"
_OLD = ".old-"
# A name swapped again on every attempt to lock it is not going to settle; say so.
_OPEN_ATTEMPTS = 5


@contextlib.contextmanager
def _parent_lock(out_dir: Path) -> Iterator[None]:
    # One swap or recovery at a time per parent directory (across processes).
    fd = os.open(out_dir.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def names(path: Path, fd: int) -> bool:
    """True when ``path`` (still) names the directory open as ``fd``."""
    try:
        named = os.stat(path)
    except OSError:  # missing: e.g. between the two renames of a swap
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def open_shared(directory: Path) -> int:
    """A descriptor of the directory ``directory`` names, holding a shared lock: a swap will not
    delete it. The name is checked after locking: a directory swapped out (and deleted, being
    unheld) between the open and the lock is let go and the new one is opened instead."""
    for _ in range(_OPEN_ATTEMPTS):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            if names(directory, fd):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise OSError(f"{directory} was replaced {_OPEN_ATTEMPTS} times while being opened")


def _unused(directory: Path) -> bool:
    """True when nobody holds a shared lock on ``directory`` (a server, or a live builder)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _complete(directory: Path) -> bool:
    try:
        read_manifest(directory)
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _siblings(out_dir: Path, kind: str) -> list[Path]:
    prefix = f".{out_dir.name}{kind}"
    found = []
    for p in out_dir.parent.iterdir():
        if not p.name.startswith(prefix):
            continue
        try:  # a builder deletes its own failed build without the parent lock: it may vanish
            st = p.stat()
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            found.append((st.st_ctime_ns, p))
    return [p for _, p in sorted(found, reverse=True)]  # newest first


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_build_dir(out_dir: Path) -> tuple[Path, int]:
    """A fresh ``.OUT.building-*`` directory and the descriptor that claims it (close it after
    ``swap_in``, or on failure after removing the directory)."""
    # Created and claimed under the parent lock: a collect in between would see it unheld.
    with _parent_lock(out_dir):
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}{_BUILDING}", dir=out_dir.parent))
        return tmp, open_shared(tmp)


def swap_in(build: Path, out_dir: Path) -> None:
    """Make the complete index at ``build`` the one at ``out_dir``."""
    with _parent_lock(out_dir):
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}{_OLD}", dir=out_dir.parent))
            os.rmdir(old)
            os.rename(out_dir, old)
            os.rename(build, out_dir)
        else:
            os.rename(build, out_dir)
        _fsync_dir(out_dir.parent)
        _collect(out_dir)


def recover(out_dir: Path) -> None:
    """Finish or undo a swap that a crash interrupted; delete leftovers nobody holds."""
    out_dir = Path(out_dir).absolute()
    if not out_dir.parent.is_dir():
        return
    with _parent_lock(out_dir):
        if not out_dir.exists():
            # Killed between the two renames: a complete build goes in (the swap only starts
            # once the build is complete), else the previous index comes back.
            done = [b for b in _siblings(out_dir, _BUILDING) if _unused(b) and _complete(b)]
            olds = [o for o in _siblings(out_dir, _OLD) if _complete(o)]
            if done or olds:
                os.rename((done or olds)[0], out_dir)
                _fsync_dir(out_dir.parent)
        _collect(out_dir)


def collect(out_dir: Path) -> None:
    """Delete old indexes and dead builds beside ``out_dir`` that nobody holds any more."""
    out_dir = Path(out_dir).absolute()
    if out_dir.parent.is_dir():
        with _parent_lock(out_dir):
            _collect(out_dir)


def _collect(out_dir: Path) -> None:
    for leftover in _siblings(out_dir, _OLD) + _siblings(out_dir, _BUILDING):
        if _unused(leftover):
            shutil.rmtree(leftover, ignore_errors=True)
