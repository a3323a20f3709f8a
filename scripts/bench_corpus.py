"""Scale benchmark of corpus-scope search: index and serve generated corpora of many pages.

For each size (default 2,000 and 20,000 pages) this generates, offline, small PDFs of 20 pages
whose pages carry varied words (a seeded Zipf draw from a synthetic vocabulary, plus each
document's own topic words), indexes them with ``build_index`` (small page images: the cost
measured is the search, not JPEG size), serves the index through the real FastAPI app
(``create_app`` + ``TestClient``) in a fresh child process, and prints: index time, index disk
size, resident memory of the served index, and p50/p99 latency and throughput of 64-query
corpus-search batches (``id`` absent, ``return_score``, answers asked as MessagePack, as the
rollout's client does) at top_n 3 and 10; then the index-time growth ratio and the verdict
against the goal (p50 under 100 ms per batch at the largest size).

The PDFs are cached under the system temp dir (``vrag-bench-corpus``), never in the repository;
indexes are rebuilt each run. Not a test:

    .venv/bin/python scripts/bench_corpus.py                      # 2,000 and 20,000 pages
    .venv/bin/python scripts/bench_corpus.py --sizes 200,2000     # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PAGES_PER_DOC = 20
BATCH = 64
GOAL_P50_MS = 100.0
CACHE = Path(tempfile.gettempdir()) / "vrag-bench-corpus" / "v1"
# Small page images: 4..16 visual tokens (about 1-3 KiB JPEGs) keep 20,000 pages to minutes.
IMAGE_BAND = {"min_pixels": 4 * 28 * 28, "max_pixels": 16 * 28 * 28, "dpi": 18}
SYLLABLES = ["ka", "lo", "mi", "ru", "te", "san", "vor", "qui", "del", "bra", "nex", "tor",
             "pel", "zu", "fa", "gon", "lim", "ost", "rea", "dun"]


def vocabulary(size: int = 6000, seed: int = 0) -> list[str]:
    """Distinct made-up words of 2-4 syllables (pure, seeded)."""
    rng = np.random.default_rng(seed)
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(SYLLABLES, size=rng.integers(2, 5))))
    return sorted(words)


def page_words(rng, vocab: list[str], topic: list[str], count: int = 90) -> list[str]:
    """A page's words: mostly a Zipf draw over the vocabulary, some of its document's topic."""
    ranks = np.minimum(rng.zipf(1.3, size=count), len(vocab)) - 1
    words = [vocab[r] for r in ranks]
    for i in rng.choice(count, size=count // 6, replace=False):
        words[i] = topic[rng.integers(len(topic))]
    return words


def write_corpus(docs: int, out: Path) -> list[Path]:
    """``docs`` PDFs of ``PAGES_PER_DOC`` pages each in ``out`` (kept: made once per size)."""
    from reportlab.lib.pagesizes import letter
    from reportlab.pdfgen import canvas

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"doc{d:05d}.pdf" for d in range(docs)]
    if all(p.exists() for p in paths):
        return paths
    vocab = vocabulary()
    for d, path in enumerate(paths):
        if path.exists():
            continue
        rng = np.random.default_rng(1000 + d)
        topic = list(rng.choice(vocab, size=12, replace=False))
        tmp = path.with_suffix(".tmp")
        c = canvas.Canvas(str(tmp), pagesize=letter, invariant=1)
        for page in range(1, PAGES_PER_DOC + 1):
            c.setFont("Helvetica-Bold", 16)
            c.drawString(72, 720, f"Section {page} {topic[page % len(topic)]}")
            c.setFont("Helvetica", 10)
            words = page_words(rng, vocab, topic)
            for line in range(0, len(words), 12):
                c.drawString(72, 690 - 14 * (line // 12), " ".join(words[line:line + 12]))
            c.showPage()
        c.save()
        tmp.rename(path)
    return paths


def queries(count: int, seed: int) -> list[str]:
    """Queries of 2-5 words, drawn as pages are (so most match some pages)."""
    rng, vocab = np.random.default_rng(seed), vocabulary()
    return [" ".join(vocab[min(int(r), len(vocab)) - 1] for r in rng.zipf(1.3, rng.integers(2, 6)))
            for _ in range(count)]


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def serve_and_measure(index: Path, batches: int, top_ns: list[int]) -> dict:
    """In this (fresh) process: load the index in the app, then time corpus-search batches."""
    import msgpack
    from fastapi.testclient import TestClient

    from retriever_server.api.app import create_app

    before = rss_bytes()
    started = time.perf_counter()
    app = create_app(index, preload="msgpack")  # as a rollout server runs: pages in memory
    out: dict = {"load_s": time.perf_counter() - started}
    headers = {"Accept": "application/msgpack"}
    with TestClient(app) as client:
        def batch(qs: list[str], top_n: int) -> float:
            t0 = time.perf_counter()
            r = client.post("/batch_search", json={"query": qs, "top_n": top_n,
                                                   "return_score": True}, headers=headers)
            answer = msgpack.unpackb(r.content)
            elapsed = time.perf_counter() - t0
            assert r.status_code == 200 and len(answer) == len(qs), r.content[:200]
            assert all(len(hits) == top_n and hits[0]["id"] != "error" for hits in answer)
            return elapsed

        batch(queries(BATCH, seed=1), max(top_ns))  # warm-up (first corpus budget, numba)
        out["rss_mib"] = rss_bytes() / 2**20
        out["rss_served_mib"] = (rss_bytes() - before) / 2**20
        for top_n in top_ns:
            times = [batch(queries(BATCH, seed=100 + b), top_n) for b in range(batches)]
            out[f"top{top_n}"] = {"p50_ms": 1000 * statistics.median(times),
                                  "p99_ms": 1000 * float(np.percentile(times, 99)),
                                  "qps": BATCH * len(times) / sum(times)}
        # Where the time goes: the ranking alone (no HTTP, no page fragments).
        backend = app.state.index.current.service.backend
        times = []
        for b in range(batches):
            qs = queries(BATCH, seed=100 + b)
            t0 = time.perf_counter()
            backend.search(qs, [None] * BATCH, max(top_ns))
            times.append(time.perf_counter() - t0)
        out["rank_only_p50_ms"] = 1000 * statistics.median(times)
    return out


def run_size(pages: int, work: Path, batches: int, top_ns: list[int]) -> dict:
    from retriever_server.indexing.indexer import build_index

    docs = max(1, pages // PAGES_PER_DOC)
    pdfs = write_corpus(docs, CACHE / f"docs{docs}")
    index = work / f"index{docs * PAGES_PER_DOC}"
    shutil.rmtree(index, ignore_errors=True)
    started = time.perf_counter()
    build_index(pdfs, index, progress=False, **IMAGE_BAND)
    result = {"pages": docs * PAGES_PER_DOC, "index_s": time.perf_counter() - started,
              "disk_mib": disk_bytes(index) / 2**20}
    # A fresh process per size, so its memory is this index's alone.
    child = subprocess.run([sys.executable, __file__, "--serve", str(index), "--batches",
                            str(batches), "--top-n", ",".join(map(str, top_ns))],
                           check=True, capture_output=True, text=True)
    result.update(json.loads(child.stdout.strip().splitlines()[-1]))
    shutil.rmtree(index, ignore_errors=True)
    return result


def report(results: list[dict], top_ns: list[int]) -> None:
    for r in results:
        print(f"\n{r['pages']:,} pages: index {r['index_s']:.1f} s, {r['disk_mib']:.1f} MiB on "
              f"disk; served: load {r['load_s']:.1f} s, RSS {r['rss_mib']:.0f} MiB "
              f"({r['rss_served_mib']:.0f} MiB for the index and app)")
        for top_n in top_ns:
            t = r[f"top{top_n}"]
            print(f"  {BATCH}-query corpus batches, top_n={top_n}: p50 {t['p50_ms']:.1f} ms, "
                  f"p99 {t['p99_ms']:.1f} ms, {t['qps']:,.0f} queries/s")
        print(f"  ranking alone (backend.search, top_n={max(top_ns)}): "
              f"p50 {r['rank_only_p50_ms']:.1f} ms per batch")
    if len(results) > 1:
        small, large = results[0], results[-1]
        scale = large["pages"] / small["pages"]
        ratio = large["index_s"] / small["index_s"]
        print(f"\nindex-time growth: {ratio:.1f}x for {scale:.0f}x pages "
              f"({'no worse than linear' if ratio <= scale * 1.05 else 'WORSE than linear'})")
    largest = results[-1]
    for top_n in top_ns:
        p50 = largest[f"top{top_n}"]["p50_ms"]
        verdict = "met" if p50 < GOAL_P50_MS else "NOT met"
        print(f"goal p50 < {GOAL_P50_MS:.0f} ms per {BATCH}-query batch at "
              f"{largest['pages']:,} pages, top_n={top_n}: {verdict} ({p50:.1f} ms)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", "--pages", default="2000,20000",
                        help="comma-separated page counts (multiples of 20), smallest first")
    parser.add_argument("--batches", type=int, default=40, help="timed batches per top_n")
    parser.add_argument("--top-n", default="3,10", help="comma-separated top_n values")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # child: measure one built index
    args = parser.parse_args(argv)
    top_ns = [int(v) for v in args.top_n.split(",")]
    if args.serve:
        print(json.dumps(serve_and_measure(Path(args.serve), args.batches, top_ns)))
        return
    print(f"machine: {os.cpu_count()} CPUs; corpus cache {CACHE}")
    work = Path(tempfile.mkdtemp(prefix="vrag-bench-index-"))
    try:
        results = []
        for pages in [int(v) for v in args.sizes.split(",")]:
            results.append(run_size(pages, work, args.batches, top_ns))
            print(f"... {results[-1]['pages']:,} pages done", flush=True)
        report(results, top_ns)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
