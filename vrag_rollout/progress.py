"""Progress lines of long steps (an engine starting, a batch's turns and episodes), for people.

Contract: the rollout and the engine report progress on the `vrag_rollout.progress` logger at
INFO (`report(message, *args)`); nothing shows unless someone listens. The command-line jobs
listen (`show_on(stream)`: one plain line each, to stderr by default), so a user sees what is
starting and how far a batch is instead of a silence; a trainer, whose logging stays at its own
level, prints none of them. A leaf module: it imports nothing of the package.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Optional, TextIO

LOGGER = logging.getLogger("vrag_rollout.progress")


def report(message: str, *args: Any) -> None:
    LOGGER.info(message, *args)


def show_on(stream: Optional[TextIO] = None) -> logging.Handler:
    """Print progress lines on `stream` (stderr); returns the handler (idempotent per stream)."""
    stream = stream if stream is not None else sys.stderr
    for handler in LOGGER.handlers:
        if getattr(handler, "stream", None) is stream:
            return handler
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False  # not again through a root handler the user configured
    return handler
