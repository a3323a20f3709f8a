"""Fork safety for the retrieval objects that hold threads, sockets or locks.

Contract: an object passed to `register` has its ``_after_fork_in_child()`` called in every
forked child (``os.register_at_fork``) for as long as it lives (a weak reference: registering
keeps nothing alive). There it replaces what the child must not use: the parent's threads,
sockets, locks and counts. What it drops goes to `keep_inherited`, which holds it for good in the
child: closing (or collecting) it there would close sockets and selectors that the parent still
uses. Used by the HTTP transports (`blocking`, `aio`), `stats.ClientStats` and
`client.RetrieverClient`; imports nothing of this package.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

# Objects holding what a forked child must not use (the parent's threads, sockets, locks):
# `_after_fork_in_child()` is called on each of them in the child.
_FORK_AWARE: "weakref.WeakSet[Any]" = weakref.WeakSet()
# What they held, kept for good in the child: closing (or collecting) it there would close
# sockets and selectors that the parent still uses.
_INHERITED: list = []


def register(obj: Any) -> None:
    """Call ``obj._after_fork_in_child()`` in each forked child while ``obj`` lives."""
    _FORK_AWARE.add(obj)


def keep_inherited(obj: Any) -> None:
    """In a forked child: hold ``obj`` (the parent's) for good, never closed nor collected."""
    _INHERITED.append(obj)


def _after_fork_in_child() -> None:
    for obj in list(_FORK_AWARE):
        obj._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
