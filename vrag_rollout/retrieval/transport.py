"""The transport contract: one logical call to one retriever server, and how it fails.

A *transport* does one logical call, ``post(path, body, timeout) -> parsed JSON``, and raises a
`TransportError` subclass (timeout, connection, http status, malformed body, overloaded) when
it cannot; `TransportError.kind` becomes the `RetrieverFailure` kind. It may also offer
``send(...) -> RawAnswer`` (the undecoded answer, read by `decode_answer`) or, to run on the
client's event loop, ``async send_async(...) -> RawAnswer`` (and ``get_async``, ``aclose``).
Implementations: `aio.AsyncHttpTransport` (aiohttp, the client's default), `blocking.HttpTransport`
(urllib3, blocking: direct use and recording), `fixtures.FixtureTransport` (replays recorded
traffic through the very same client logic).

This module holds what both HTTP transports share, so their policy is written once:
`HttpSettings` (their settings and headers), the retry policy (`RETRY_STATUSES` are tried
again, with backoff doubling per retry up to `BACKOFF_MAX_S`; `call_bound_s` is the longest one
logical call takes), admission-control refusals (a `REFUSAL_STATUSES` status *with*
``Retry-After`` is not retried but raised at once as `TransportOverloaded`, carrying the
server's hints: `parse_retry_after`, `retry_after_ms`), the failure messages (`tries_text`) and
answer decoding.

Answer format: the HTTP transports ask for MessagePack (``Accept: application/msgpack,
application/json;q=0.5``); this project's server then sends each image as its JPEG bytes, a
quarter smaller than base64 and nothing to decode (measured: 0.20 ms of client CPU for an
answer of 8 images that took 0.44 ms as JSON). A server that only speaks JSON (ALDEN's) answers JSON,
read as before. `decode_answer` reads an answer as its ``Content-Type`` says; images are NOT
decoded here.
"""

from __future__ import annotations

import json
from typing import Any, Callable, NamedTuple, Optional, Protocol, Union

from urllib3.exceptions import InvalidHeader
from urllib3.util import Retry

from retriever_server import contract

try:
    # An answer is ~1 MB of JSON, mostly base64 strings: msgspec decodes it about 6x faster
    # than the standard library (measured 0.2 ms vs 1.2 ms), and reads MessagePack.
    import msgspec

    _loads: Callable[[bytes], Any] = msgspec.json.Decoder().decode
    _unpack: Optional[Callable[[bytes], Any]] = msgspec.msgpack.Decoder().decode
except ImportError:  # same values, slower; JSON answers only
    _loads, _unpack = json.loads, None

# Transient statuses: worth another try. Other 4xx mean our request is wrong; retrying won't help.
RETRY_STATUSES = frozenset([429, *range(500, 600)])
# With a Retry-After header these are refusals by admission control, not faults.
REFUSAL_STATUSES = frozenset([429, 503])
BACKOFF_MAX_S = 10.0  # the longest wait between two tries of a call


class TransportError(Exception):
    """A call that produced no usable body. `kind` becomes the RetrieverFailure kind."""

    kind = "connection"

    def __init__(self, message: str, *, tries: int = 1):
        super().__init__(message)
        self.tries = tries


class TransportTimeout(TransportError):
    kind = "timeout"


class TransportConnectionError(TransportError):
    kind = "connection"


class TransportHTTPError(TransportError):
    kind = "http"

    def __init__(self, status: int, message: str, *, tries: int = 1):
        super().__init__(message, tries=tries)
        self.status = status


class TransportMalformed(TransportError):
    kind = "malformed"


class TransportOverloaded(TransportError):
    """The server refused the call for now (503/429 with Retry-After): admission control."""

    kind = "overloaded"

    def __init__(self, status: int, retry_after: Optional[float], message: str,
                 retry_after_ms: Optional[float] = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after  # seconds; None when the header was unreadable
        # Retry-After-Ms (sent by this project's server, and by some public APIs), in seconds:
        # the same prediction, not rounded to whole seconds. None when absent or unreadable.
        self.retry_after_ms = retry_after_ms


class RawAnswer(NamedTuple):
    """An answer's body and its ``Content-Type`` (None when absent), not yet decoded."""

    data: bytes
    content_type: Optional[str] = None


class Transport(Protocol):
    """A transport may also offer ``send(path, body, timeout) -> RawAnswer`` (the undecoded
    answer, read by ``decode_answer``), as ``HttpTransport`` does: the client then decodes
    outside the window's slot. One offering ``async send_async(...) -> RawAnswer`` (and
    ``get_async``, ``aclose``), as ``AsyncHttpTransport`` does, runs on the client's loop."""

    def post(self, path: str, body: dict, timeout: float) -> Any: ...

    def get(self, path: str, timeout: float) -> Any: ...

    def close(self) -> None: ...


def tries_text(n: int) -> str:
    return "1 try" if n == 1 else f"{n} tries"


def call_bound_s(timeout: float, retries: int, backoff: float) -> float:
    """The longest one logical call takes (the HTTP transports' policy): ``retries + 1`` tries
    of at most ``timeout`` each, and the waits between them (see `HttpSettings`)."""
    waits = sum(min(BACKOFF_MAX_S, backoff * (2 ** k + 0.5)) for k in range(1, retries))
    return (retries + 1) * timeout + waits


def accept_header(binary: bool) -> str:
    """What to ask for: MessagePack first when ``binary`` (and msgspec can read it), else JSON."""
    if binary and _unpack is not None:
        return f"{contract.MSGPACK}, {contract.JSON};q=0.5"
    return contract.JSON


_RETRY_AFTER = Retry(0)


def parse_retry_after(value: str) -> Optional[float]:
    """A ``Retry-After`` header (seconds or an HTTP date) in seconds; None when unreadable."""
    try:
        return _RETRY_AFTER.parse_retry_after(value)
    except InvalidHeader:
        return None


def retry_after_ms(value: Optional[str]) -> Optional[float]:
    """The ``Retry-After-Ms`` header in seconds; None when absent or not a number >= 0."""
    try:
        ms = float(value) if value is not None else None
    except ValueError:
        return None
    return ms / 1000 if ms is not None and 0 <= ms < float("inf") else None


class HttpSettings:
    """What both HTTP transports (`HttpTransport`, `aio.AsyncHttpTransport`) take:
    ``retries`` after the first try, ``backoff`` (seconds, doubled per retry), ``api_key`` (the
    ``X-API-Key`` header), ``max_connections`` kept open, ``on_retries(n)`` (told how many
    retries a call used), ``fail_fast_on_connect`` (a refused connection is not retried: with
    replicas the chunk goes to the next one) and ``binary`` (ask for MessagePack answers, images
    as bytes, where the server has them; False: JSON only, e.g. to record fixtures exactly as
    JSON clients see them)."""

    def __init__(
        self,
        base_url: str,
        *,
        retries: int = 2,
        backoff: float = 0.25,
        api_key: str | None = None,
        max_connections: int = 4,
        on_retries: Callable[[int], None] | None = None,
        fail_fast_on_connect: bool = False,
        binary: bool = True,
    ):
        self.base_url = base_url.rstrip("/")
        self._retries, self._backoff = retries, backoff
        self._max_connections = max(1, max_connections)
        self._on_retries = on_retries
        self._fail_fast_on_connect = fail_fast_on_connect
        self._headers = {"Content-Type": contract.JSON, "Accept": accept_header(binary)}
        if api_key:
            self._headers["X-API-Key"] = api_key

    def _count_retries(self, n: int) -> None:
        if n and self._on_retries is not None:
            self._on_retries(n)


def decode_json(data: bytes) -> Any:
    """An answer's body as JSON values; TransportMalformed when it is not JSON."""
    try:
        return _loads(data)
    # msgspec.DecodeError is a ValueError; both decoders raise RecursionError past their depth limit
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise TransportMalformed("retriever sent a body that is not JSON") from e


def decode_answer(answer: Union[RawAnswer, bytes]) -> Any:
    """An answer's values, read as its ``Content-Type`` says (MessagePack or, by default, JSON;
    plain bytes, as transports written before `RawAnswer` send them, are JSON);
    TransportMalformed when the body is not what it claims."""
    if not isinstance(answer, RawAnswer):
        return decode_json(answer)
    if not contract.is_msgpack(answer.content_type):
        return decode_json(answer.data)
    if _unpack is None:
        raise TransportMalformed("retriever sent MessagePack, which needs msgspec installed")
    try:
        return _unpack(answer.data)
    except (ValueError, RecursionError) as e:  # msgspec.DecodeError is a ValueError
        raise TransportMalformed("retriever sent a body that is not MessagePack") from e
