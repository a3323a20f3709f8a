"""The retriever client: wire format, transports, congestion control, recorded fixtures.

Rule (tests/test_layers.py): imports nothing of `core/`, `engine/` or `rollout/` (only the
server's dependency-free wire contract, `retriever_server.contract`); within it, no import
cycle: `client` may import any module here, and none of them imports `client` except `fixtures`.

- `types`: the data types (`RetrievedPage`, `RetrieverFailure`, `FetchSpec`, `MODALITIES`, `FAILURE_KINDS`).
- `transport`: the transport contract, its errors, the HTTP transports' shared settings and retry policy, answer decoding.
- `blocking`: `HttpTransport`, the blocking urllib3 transport.
- `aio`: `AsyncHttpTransport`, the aiohttp transport, and `LoopThread`, the client's event-loop thread.
- `wire`: request bodies and answer parsers (pure).
- `congestion`: replica choice (`ReplicaSet`) and per-replica congestion windows (`AdaptiveLimit`).
- `stats`: `ClientStats`, the client's counters.
- `forking`: fork safety: what each forked child must replace, and what it must keep.
- `client`: `RetrieverClient` (chunking, concurrency, fail-over, deadlines), re-exporting the public names above.
- `fixtures`: recording and replaying retriever traffic.
- `preflight`: before a rollout, is the retriever reachable and does it serve the batch's documents; the failure-rate warning.
"""
