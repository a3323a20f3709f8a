"""Encoder speed mechanisms on the tiny ColQwen2: page preprocessing in worker processes pipelined
with the model, and queries batched across concurrent callers. Oracles: the serial path, the
processor run in-process, and each query encoded alone."""

from __future__ import annotations

import io
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image

from retriever_server.encoders.batching import QueryBatcher
from retriever_server.encoders.colqwen2 import ColQwen2Encoder
from retriever_server.encoders.pipeline import PreparePool

from .dense_support import tiny_colqwen2

# Padding is on the right and attention is causal, so a query's rows in a padded batch differ
# from its rows alone only by float32 rounding (different GEMM shapes): measured at ~2e-7 on
# unit-norm rows. 1e-5 allows for that and nothing more (a wrong mask or position is ~1e-1).
PADDING_ATOL = 1e-5

QUERIES = ["terminal", "how do I configure the output terminal", "a", "plot the sine of x",
           "what does the manual say about fonts and colours in the legend", "gnuplot", "axes",
           "logscale on y"]


def _page(i: int, size=(850, 1100)) -> bytes:
    image = Image.new("RGB", size, "white")
    image.paste((40 * i % 256, 90, 200), (60, 80 + 30 * i, 700, 160 + 30 * i))
    out = io.BytesIO()
    image.save(out, "JPEG")
    return out.getvalue()


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    enc = ColQwen2Encoder(tiny_colqwen2(tmp_path_factory.getbasetemp()), batch_size=2,
                          prep_workers=1, query_window_s=0.05)
    yield enc
    enc.close()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.process
def test_pipelined_pages_equal_serial_pages(encoder):
    pages = [_page(i) for i in range(4)] + [_page(4, (1100, 850)), _page(5, (400, 1200)),
                                            _page(6)]  # 7 pages: the last batch is short
    pipelined = encoder.encode_images(pages)
    assert encoder._pool.pids(), "the pipelined path ran in worker processes"
    serial = encoder.encode_images_serial(pages)
    assert len(pipelined) == len(pages)
    for p, s in zip(pipelined, serial, strict=True):
        assert p.dtype == np.float32 and np.array_equal(p, s)


@pytest.mark.process
def test_worker_inputs_equal_the_processor_bit_for_bit(encoder):
    batches = [[_page(0), _page(1, (1100, 850))], [_page(2, (400, 1200))]]
    for batch, prepared in zip(batches, encoder._pool.imap(batches), strict=True):
        expected = encoder.processor.process_images(
            images=[Image.open(io.BytesIO(j)).convert("RGB") for j in batch])
        assert set(prepared) == set(expected) >= {"pixel_values", "image_grid_thw", "input_ids"}
        for key, value in expected.items():
            assert prepared[key].dtype == value.dtype and torch.equal(prepared[key], value), key
    assert encoder._pool.pids() and all(pid != os.getpid() for pid in encoder._pool.pids())


def test_padding_does_not_change_a_querys_vectors(encoder):
    together = encoder._encode_queries_now(QUERIES)
    for query, row in zip(QUERIES, together, strict=True):
        alone = encoder._encode_queries_now([query])[0]
        assert row.shape == alone.shape
        np.testing.assert_allclose(row, alone, atol=PADDING_ATOL, rtol=0)


def _concurrently(fn, args: list) -> list:
    """fn(arg) in one thread per arg, all released at once; results (or exceptions) in order."""
    start = threading.Barrier(len(args))
    results: list = [None] * len(args)

    def call(i):
        start.wait(timeout=10)
        try:
            results[i] = fn(args[i])
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    return results


def test_collector_batches_concurrent_callers(encoder):
    seen: list[list[str]] = []

    def encode(queries):
        seen.append(list(queries))
        return encoder._encode_queries_now(queries)

    batcher = QueryBatcher(encode, max_batch=64, window_s=0.2)
    try:
        # Each caller asks for one or two queries.
        asks = [[q] for q in QUERIES] + [[QUERIES[1], QUERIES[0]], [QUERIES[4], QUERIES[2]]]
        results = _concurrently(batcher.encode, asks)
    finally:
        batcher.close()
    assert 1 <= batcher.calls == len(seen) < len(asks)
    # Each caller has exactly its rows of the shared call, and they match the query alone.
    shared = {}
    for batch in seen:
        for query, row in zip(batch, encoder._encode_queries_now(batch), strict=True):
            shared.setdefault(query, []).append(row)
    for ask, rows in zip(asks, results, strict=True):
        assert len(rows) == len(ask)
        for query, row in zip(ask, rows, strict=True):
            assert any(np.array_equal(row, r) for r in shared[query])
            np.testing.assert_allclose(row, encoder._encode_queries_now([query])[0],
                                       atol=PADDING_ATOL, rtol=0)


def test_encoder_batches_its_concurrent_queries(encoder):
    before = encoder._batcher.calls
    results = _concurrently(lambda q: encoder.encode_queries([q])[0], QUERIES)
    assert encoder._batcher.calls - before < len(QUERIES)
    for query, row in zip(QUERIES, results, strict=True):
        np.testing.assert_allclose(row, encoder._encode_queries_now([query])[0],
                                   atol=PADDING_ATOL, rtol=0)


def test_a_model_error_reaches_every_caller_and_the_next_batch_works():
    calls = []

    def encode(queries):
        calls.append(list(queries))
        if len(calls) == 1:
            raise RuntimeError("CUDA out of memory (simulated)")
        return [f"row:{q}" for q in queries]

    # The batch closes when all four callers are in (max_batch), long before the window ends.
    batcher = QueryBatcher(encode, max_batch=4, window_s=5.0)
    try:
        results = _concurrently(lambda q: batcher.encode([q]), ["a", "b", "c", "d"])
        assert len(calls) == 1
        assert all(isinstance(r, RuntimeError) and "out of memory" in str(r) for r in results)
        assert batcher.encode(list("efgh"), timeout_s=10) == ["row:e", "row:f", "row:g", "row:h"]
    finally:
        batcher.close()


def test_a_caller_whose_batch_never_completes_times_out():
    release = threading.Event()

    def encode(queries):
        release.wait(timeout=30)  # a stuck model call
        return queries

    batcher = QueryBatcher(encode, window_s=0.0)
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="did not finish"):
            batcher.encode(["stuck"], timeout_s=0.3)
        # A request queued behind the stuck call times out too, and is then dropped, not run.
        with pytest.raises(TimeoutError):
            batcher.encode(["queued"], timeout_s=0.3)
        assert time.monotonic() - started < 5
    finally:
        release.set()
        batcher.close()
    assert batcher.calls == 1
    with pytest.raises(RuntimeError, match="closed"):
        batcher.encode(["late"])


@pytest.mark.process
def test_close_stops_the_workers():
    # A generic pool (prepare = len): the mechanism does not depend on the model.
    pool = PreparePool(int, (), len, workers=2, depth=3)
    assert list(pool.imap([[1, 2], [3], [], [4, 5, 6]])) == [2, 1, 0, 3]
    pids = pool.pids()
    assert pids
    pool.close()
    assert all(_gone(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        list(pool.imap([[1]]))


@pytest.mark.process
def test_a_dead_worker_fails_the_call_and_the_next_call_starts_fresh_workers():
    from concurrent.futures.process import BrokenProcessPool

    pool = PreparePool(int, (), signal.raise_signal, workers=1)  # prepare(9) kills the worker
    try:
        with pytest.raises(BrokenProcessPool):
            list(pool.imap([signal.SIGKILL]))
        with pytest.raises(OSError):  # raise_signal(-1) fails: answered by a fresh worker
            list(pool.imap([-1]))
    finally:
        pool.close()


@pytest.mark.process
def test_encoder_close_stops_its_workers(encoder):
    # Runs last in this module: the module's encoder is closed here (the fixture closes it again).
    pids = encoder._pool.pids()
    assert pids
    encoder.close()
    assert all(_gone(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        encoder.encode_queries(["after close"])



@pytest.mark.process
def test_an_encoder_dropped_without_close_lets_its_workers_go(tmp_path_factory):
    import gc

    enc = ColQwen2Encoder(tiny_colqwen2(tmp_path_factory.getbasetemp()), prep_workers=1)
    pids = enc._pool.start()
    collector = enc._batcher._thread
    assert pids and collector.is_alive()
    del enc
    gc.collect()
    deadline = time.monotonic() + 30
    while not (all(_gone(pid) for pid in pids) and not collector.is_alive()):
        assert time.monotonic() < deadline, "workers or collector outlived their encoder"
        time.sleep(0.05)
