"""A tokenizer that any thread may call: one call at a time per underlying tokenizer.

Why a lock and not just care: a Hugging Face fast tokenizer keeps encode-time modes as state on
its backend (`split_special_tokens` is written to the backend's `encode_special_tokens` at the
start of every encode, and read while encoding; padding and truncation likewise), so two threads
encoding in different modes at once encode each other's text in the wrong mode, with no error.
The rollout's tool threads encode page text with special-token strings kept as text, while the
tool-turn template encodes its rendering with them as special tokens.

Only encoding writes state (decoding, chat-template rendering and vocabulary lookups read it),
but every call is guarded alike so that no one has to know which do.

Contract: every call through a `SerialTokenizer` holds the lock of the tokenizer it wraps, and
that lock is one per tokenizer object (`lock_for`), so two wrappers of the same tokenizer, made
anywhere, exclude each other. Code that keeps a tokenizer for use after construction keeps it
wrapped (`serial(tokenizer)` is idempotent); reading plain attributes (ids of special tokens) is
safe without the lock, and `raw` is for construction-time use on one thread only. A caller's
own code never takes this lock, so the rollout works on a `private_copy` of the caller's
tokenizer: nothing it runs on other threads can change the caller's.
"""

from __future__ import annotations

import copy
import threading
import weakref
from typing import Any

_locks: "weakref.WeakKeyDictionary[Any, threading.RLock]" = weakref.WeakKeyDictionary()
_locks_guard = threading.Lock()


def lock_for(obj: Any) -> threading.RLock:
    """The one lock of `obj` for as long as it lives (re-entrant, so code that holds it may call
    through another wrapper of the same tokenizer)."""
    with _locks_guard:
        lock = _locks.get(obj)
        if lock is None:
            lock = _locks[obj] = threading.RLock()
        return lock


class SerialTokenizer:
    """The tokenizer methods this package calls at run time, each under the tokenizer's lock."""

    def __init__(self, tokenizer: Any):
        if isinstance(tokenizer, SerialTokenizer):
            tokenizer = tokenizer.raw
        self.raw = tokenizer
        self.lock = lock_for(tokenizer)

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        with self.lock:
            return list(self.raw.encode(text, **kwargs))

    def decode(self, ids: Any, **kwargs: Any) -> str:
        with self.lock:
            return self.raw.decode(ids, **kwargs)

    def apply_chat_template(self, messages: Any, **kwargs: Any) -> Any:
        with self.lock:
            return self.raw.apply_chat_template(messages, **kwargs)

    def convert_tokens_to_ids(self, tokens: Any) -> Any:
        with self.lock:
            return self.raw.convert_tokens_to_ids(tokens)

    def get_vocab(self) -> dict:
        with self.lock:
            return self.raw.get_vocab()

    def __len__(self) -> int:
        with self.lock:
            return len(self.raw)

    def __getattr__(self, name: str) -> Any:
        """Plain attributes (`pad_token_id`, `eos_token_id`, ...) read through; a method not
        listed above is refused rather than called without the lock."""
        if name in ("raw", "lock"):  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        value = getattr(self.raw, name)
        if callable(value) or name.startswith("_") or name == "backend_tokenizer":  # the mutable backend
            raise AttributeError(f"{name!r} is not available through SerialTokenizer (it would run "
                                 "without the tokenizer's lock): add it to SerialTokenizer")
        return value


def serial(tokenizer: Any) -> SerialTokenizer:
    """`tokenizer` wrapped (once: a wrapped one is returned as it is)."""
    return tokenizer if isinstance(tokenizer, SerialTokenizer) else SerialTokenizer(tokenizer)


def private_copy(tokenizer: Any) -> SerialTokenizer:
    """A wrapped copy of `tokenizer` that shares no state with it: for a component whose threads
    may still run while the caller tokenizes with its own tokenizer, without this lock."""
    raw = tokenizer.raw if isinstance(tokenizer, SerialTokenizer) else tokenizer
    return SerialTokenizer(copy.deepcopy(raw))
