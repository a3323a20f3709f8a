#!/usr/bin/env python
"""Benchmark the page-image retriever: index throughput, then serving latency and throughput.

1. Generates a corpus of synthetic multi-page PDFs (reportlab, seeded, >= 2,000 pages).
2. Indexes it with ``build_index`` (text layer + render + JPEG encode + BM25) -> pages/s.
3. Starts ``vrag-retriever serve`` on 127.0.0.1 in a subprocess and drives it with concurrent
   clients sending ``/batch_search`` of 64 queries x top_n=3 for a fixed time -> p50/p99 latency
   per batch, queries/s, bytes per page. Each client checks that its first answer ranks the
   queried page first (the queries are words taken from one page).

4. Unless ``--no-qdrant``: indexes the first ``--qdrant-docs`` documents again with the Qdrant
   backend (local mode, dense MaxSim search) and a ColQwen2 encoder (``--encoder colqwen2:PATH``;
   default: the tiny random ColQwen2 built offline, so the numbers measure the engine and the
   serving path, not a real model's forward pass), serves it the same way and reports its
   encoding rate, latency and throughput beside the BM25 numbers (no targets; the tiny model
   ranks at random, so its answers are not checked). Qdrant's local mode is qdrant-client's
   pure-Python engine (meant for tests; it scans every point per query), so these numbers are a
   floor for the serving path, not what a Qdrant server (``--qdrant-url``) does.

Targets (2-core machine, BM25): p50 < 150 ms per 64-query batch, > 500 queries/s, indexing
> 50 pages/s.
Usage: python scripts/bench_retriever.py [--pages 2000] [--clients 4] [--duration 15]
       [--no-qdrant] [--qdrant-docs 3] [--encoder colqwen2:PATH]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from reportlab.lib.pagesizes import letter
from reportlab.pdfgen import canvas

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retriever_server.indexing.indexer import build_index  # noqa: E402
from retriever_server.storage.imaging import DEFAULT_DPI, DEFAULT_MAX_PIXELS  # noqa: E402
from retriever_server.storage.store import PageStore  # noqa: E402

BATCH = 64
TOP_N = 3
TARGET_P50_MS = 150.0
TARGET_QPS = 500.0
TARGET_INDEX_PPS = 50.0

_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "vo", "si", "de", "po", "gu", "fa", "ze", "ba",
              "ni", "xo", "le", "ma", "tu", "ro"]


def _vocabulary(rng: random.Random, size: int) -> list[str]:
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def generate_corpus(out: Path, pages: int, docs: int, seed: int = 7) -> dict[tuple[str, int], list[str]]:
    """Write ``docs`` PDFs holding ``pages`` pages in total; returns each page's rare words.

    Pages look like manual pages: a heading, body paragraphs, a small table and a bar chart.
    """
    rng = random.Random(seed)
    words = _vocabulary(rng, 20400)
    common, rare = words[:400], words[400:]
    rng.shuffle(rare)
    out.mkdir(parents=True, exist_ok=True)
    per_doc = -(-pages // docs)
    page_words: dict[tuple[str, int], list[str]] = {}
    written = 0
    for d in range(docs):
        doc_id = f"manual_{d:03d}"
        c = canvas.Canvas(str(out / f"{doc_id}.pdf"), pagesize=letter, invariant=1)
        for p in range(1, min(per_doc, pages - written) + 1):
            keys = [rare.pop() for _ in range(4)]
            page_words[(doc_id, p)] = keys
            c.setFont("Helvetica-Bold", 15)
            c.drawString(72, 720, f"Manual {d}, section {p}: {keys[0]} {keys[1]}")
            text = c.beginText(72, 690)
            text.setFont("Helvetica", 10)
            for line in range(22):
                row = rng.choices(common, k=11)
                if line in (4, 15):
                    row[5:7] = keys[2:4] if line == 4 else keys[:2]
                text.textLine(" ".join(row))
                if line % 7 == 6:
                    text.textLine("")
            c.drawText(text)
            # A small table and a bar chart, like most manual pages have.
            c.setFont("Helvetica", 9)
            for r in range(4):
                for col in range(3):
                    c.rect(72 + col * 80, 260 - r * 16, 80, 16)
                    c.drawString(76 + col * 80, 265 - r * 16, rng.choice(common))
            for b in range(6):
                h = rng.randint(10, 110)
                c.setFillGray(0.3 + 0.1 * b)
                c.rect(350 + b * 30, 150, 22, h, fill=1, stroke=0)
            c.setFillGray(0)
            c.drawString(72, 60, f"manual {d} page {p}")
            c.showPage()
            written += 1
        c.save()
    return page_words


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its direct children (uvicorn workers), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid]
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        pids += [int(c) for c in children.read_text().split()]
    total = 0.0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _wait_healthy(port: int, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("server did not become healthy")


def _client(port: int, batches: list[bytes], expect: list[list[str]], stop_at: float,
            latencies: list[float], errors: list[str], totals: list[int]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/json"}
    i = 0
    while time.monotonic() < stop_at:
        body = batches[i % len(batches)]
        t0 = time.perf_counter()
        conn.request("POST", "/batch_search", body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        latencies.append(time.perf_counter() - t0)
        if resp.status != 200:
            errors.append(f"HTTP {resp.status}")
        elif i == 0 and expect:  # verify one full answer per client, outside the timed section
            got = [hits[0]["id"] if hits and hits[0]["id"] != "error" else "error"
                   for hits in json.loads(data)]
            wrong = sum(g != e for g, e in zip(got, expect[0]))
            if wrong:
                errors.append(f"{wrong} of {len(got)} queries did not rank their page first")
        totals[0] += BATCH
        totals[1] += len(data)
        i += 1
    conn.close()


def run_load(port: int, batches: list[bytes], expect: list[list[str]], clients: int,
             duration: float) -> dict:
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[list[str]] = [[] for _ in range(clients)]
    totals = [[0, 0] for _ in range(clients)]
    start = time.monotonic()
    stop_at = start + duration
    threads = [threading.Thread(target=_client, args=(port, batches[k::clients] or batches,
                                                      (expect[k::clients] or expect) if expect
                                                      else None, stop_at,
                                                      latencies[k], errors[k], totals[k]))
               for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    lat = sorted(x for per in latencies for x in per)
    return {
        "batches": len(lat),
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "qps": sum(t[0] for t in totals) / elapsed,
        "mb_per_s": sum(t[1] for t in totals) / elapsed / 1e6,
        "errors": [e for per in errors for e in per],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=2000)
    ap.add_argument("--docs", type=int, default=20)
    ap.add_argument("--clients", type=int, default=2, help="concurrent client connections")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds of load")
    ap.add_argument("--workers", type=int, default=1, help="server processes")
    ap.add_argument("--index-workers", type=int, default=None, help="indexing processes")
    ap.add_argument("--dpi", type=float, default=DEFAULT_DPI, help="PDF render resolution")
    ap.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS)
    ap.add_argument("--workdir", type=Path, default=None, help="keep corpus and index here")
    ap.add_argument("--no-qdrant", action="store_true", help="skip the Qdrant backend")
    ap.add_argument("--qdrant-docs", type=int, default=3, help="documents indexed for Qdrant")
    ap.add_argument("--encoder", default=None,
                    help="colqwen2:PATH for Qdrant (default: the tiny random ColQwen2)")
    args = ap.parse_args()

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-retriever-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    page_words = generate_corpus(work / "corpus", args.pages, args.docs)
    print(f"generated {len(page_words)} pages in {args.docs} PDFs in {time.perf_counter() - t0:.1f} s")

    t0, cpu0 = time.perf_counter(), os.times()
    index = build_index([work / "corpus"], work / "index", progress=sys.stderr.isatty(),
                        max_pixels=args.max_pixels, dpi=args.dpi, workers=args.index_workers)
    index_s, cpu1 = time.perf_counter() - t0, os.times()
    index_cpu = (cpu1.user - cpu0.user + cpu1.system - cpu0.system
                 + cpu1.children_user - cpu0.children_user + cpu1.children_system - cpu0.children_system)
    index_pps = len(page_words) / index_s
    store = PageStore.open(index)
    jpeg_bytes = [p.bytes for p in store.manifest.pages]
    mean_jpeg = statistics.fmean(jpeg_bytes)
    sizes = {(p.width, p.height) for p in store.manifest.pages}
    print(f"indexed {len(page_words)} pages in {index_s:.1f} s = {index_pps:.0f} pages/s wall "
          f"({len(page_words) / index_cpu:.0f} pages per CPU-second; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    print(f"  page size {sorted(sizes)[0]}, JPEG mean {mean_jpeg / 1024:.1f} KiB, "
          f"base64 {mean_jpeg * 4 / 3 / 1024:.1f} KiB")

    # Queries: two rare words of a random page, asked of that page's document.
    rng = random.Random(11)
    keys = sorted(page_words)
    batches, expect = [], []
    for _ in range(64):
        chosen = [rng.choice(keys) for _ in range(BATCH)]
        queries = [" ".join(rng.sample(page_words[k], 2)) for k in chosen]
        batches.append(json.dumps({"query": queries, "id": [k[0] for k in chosen], "top_n": TOP_N,
                                   "return_score": False}).encode())
        expect.append([f"{d}_{p}" for d, p in chosen])

    try:
        res, server_cpu_ms, load_avg = serve_and_load(index, batches, expect, args.workers, args)
        dense = None if args.no_qdrant else bench_qdrant(work, page_words, args)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)

    page_bytes = res["mb_per_s"] * 1e6 / (res["qps"] * TOP_N)
    print(f"load: {args.clients} clients x {args.duration:.0f} s, {args.workers} server worker(s), "
          f"{res['batches']} batches of {BATCH} queries x top_n={TOP_N}")
    print(f"  latency per batch: p50 {res['p50_ms']:.1f} ms, p99 {res['p99_ms']:.1f} ms")
    print(f"  server CPU per batch: {server_cpu_ms:.1f} ms; 1-min load average at the end "
          f"{load_avg:.1f} on {os.cpu_count()} CPUs (other processes compete for the same cores)")
    print(f"  throughput: {res['qps']:.0f} queries/s, {res['mb_per_s']:.0f} MB/s of JSON, "
          f"{page_bytes / 1024:.1f} KiB per returned page on the wire")
    if res["errors"]:
        print(f"  errors: {len(res['errors'])}, e.g. {res['errors'][:3]}")
    checks = [
        ("p50 latency per 64-query batch", f"{res['p50_ms']:.1f} ms", f"< {TARGET_P50_MS:.0f} ms",
         res["p50_ms"] < TARGET_P50_MS),
        ("queries/s", f"{res['qps']:.0f}", f"> {TARGET_QPS:.0f}", res["qps"] > TARGET_QPS),
        ("indexing pages/s", f"{index_pps:.0f}", f"> {TARGET_INDEX_PPS:.0f}", index_pps > TARGET_INDEX_PPS),
        ("no errors, right pages", str(len(res["errors"])), "0", not res["errors"]),
    ]
    if dense is not None:
        print(f"qdrant (local mode, dense MaxSim, encoder {dense['encoder']}): "
              f"{dense['pages']} pages of {args.qdrant_docs} documents")
        print(f"  indexing incl. encoding: {dense['index_pps']:.1f} pages/s; "
              f"{dense['vectors']} vectors per page")
        print(f"  latency per batch: p50 {dense['res']['p50_ms']:.1f} ms, "
              f"p99 {dense['res']['p99_ms']:.1f} ms; {dense['res']['qps']:.0f} queries/s "
              f"(query encoding included); server CPU per batch {dense['cpu_ms']:.1f} ms")
        if dense["res"]["errors"]:
            print(f"  errors: {len(dense['res']['errors'])}, e.g. {dense['res']['errors'][:3]}")
    print()
    for name, got, want, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {got} (target {want})")
    return 0 if all(ok for *_, ok in checks) else 1


def serve_and_load(index: Path, batches, expect, workers: int, args) -> tuple[dict, float, float]:
    """Serve ``index`` in a subprocess, warm up, and drive it; (results, CPU ms/batch, load)."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    # Throughput and latency, not admission control: these plain clients do not retry refusals,
    # so every request may queue (the default queues only about one service's worth).
    server = subprocess.Popen(
        [sys.executable, "-m", "retriever_server.cli", "serve", "--index", str(index), "--host",
         "127.0.0.1", "--port", str(port), "--workers", str(workers), "--preload", "json",
         "--queue-services", "none", "--log-level", "warning"], env=env)
    try:
        _wait_healthy(port, server)
        run_load(port, batches, expect, args.clients, 2.0)  # warm-up
        cpu0 = _cpu_seconds(server.pid)
        res = run_load(port, batches, expect, args.clients, args.duration)
        server_cpu_ms = 1000 * (_cpu_seconds(server.pid) - cpu0) / max(1, res["batches"])
        return res, server_cpu_ms, os.getloadavg()[0]
    finally:
        server.terminate()
        server.wait(timeout=30)


def bench_qdrant(work: Path, page_words: dict, args) -> dict:
    """Index the first ``--qdrant-docs`` documents into Qdrant (local mode) and load-test it."""
    from retriever_server.encoders.tiny import build_tiny_colqwen2

    encoder = args.encoder or f"colqwen2:{build_tiny_colqwen2(work / 'tiny-colqwen2')}"
    doc_ids = sorted({d for d, _ in page_words})[:args.qdrant_docs]
    t0 = time.perf_counter()
    index = build_index([work / "corpus" / f"{d}.pdf" for d in doc_ids], work / "index-qdrant",
                        progress=sys.stderr.isatty(), max_pixels=args.max_pixels, dpi=args.dpi,
                        encoder=encoder, search="dense")
    pages = sum(PageStore.open(index).documents().values())
    index_pps = pages / (time.perf_counter() - t0)
    rng = random.Random(12)
    keys = sorted(k for k in page_words if k[0] in doc_ids)
    batches = []
    for _ in range(16):
        chosen = [rng.choice(keys) for _ in range(BATCH)]
        batches.append(json.dumps({"query": [" ".join(rng.sample(page_words[k], 2)) for k in chosen],
                                   "id": [k[0] for k in chosen], "top_n": TOP_N}).encode())
    # Local mode: one process owns the collection folder, so one server worker.
    res, cpu_ms, _ = serve_and_load(index, batches, None, 1, args)
    from retriever_server.encoders import load_encoder

    sample = load_encoder(encoder).encode_images([PageStore.open(index).page_image(doc_ids[0], 1).jpeg])
    return {"encoder": "tiny random ColQwen2" if not args.encoder else args.encoder,
            "pages": pages, "index_pps": index_pps, "res": res, "cpu_ms": cpu_ms,
            "vectors": sample[0].shape[0]}


if __name__ == "__main__":
    sys.exit(main())
