"""Dense late-interaction search at corpus scale: which engine, measured (docs/dense-corpus.md).

    .venv/bin/python scripts/bench_dense_corpus.py [--sizes 2000 20000] [--queries 64]

Corpus (offline, deterministic): the tiny ColQwen2 (``encoders.tiny``, random weights, 32 dims)
encodes ``--distinct`` (2,000) generated page images (168x224 px: coloured blocks and text lines,
48 visual tokens + the processor's prompt tokens, 77 vectors a page). A corpus larger than
that is filled with *derived* pages, near-duplicates as in a real collection of templated
reports: a random base page whose vectors are each, with probability 1/4, swapped for a vector of
another random base page, 0-20 % of them dropped, then jittered (Gaussian noise, sigma 0.02 per
dimension) and re-normalised.

Queries with a known relevant page: 14 vectors drawn from a random target page, jittered
(sigma 0.05) and re-normalised, plus the 6 first vectors of an encoded text query (the query
prompt's tokens, as every real query has). ``hit@10`` says how often the target page is in the
top 10; ``recall@10`` compares with exact MaxSim by brute force (the oracle).

Engines: exact numpy brute force; Qdrant local mode (``qdrant-client`` ``path=``, today's
backend; only up to ``--qdrant-local-max`` pages, 2,000: its build is slow); Qdrant's Rust
engine in-process (``qdrant-edge-py``, where installed): plain (exact) MaxSim, float32 and int8
scalar-quantised without rescoring, and its HNSW index over the multi-vectors (m 16, ef 100),
float32 and int8 with rescoring (int8 only up to ``--qdrant-hnsw-int8-max`` pages); pooled / MUVERA-style first stage + exact MaxSim re-rank
(``backends.late_interaction``). Latency: each query timed alone (p50/p99), and the whole batch.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retriever_server.backends.late_interaction import LateInteractionIndex  # noqa: E402

TOP = 10
REAL_PAGES, REAL_VECTORS, REAL_DIM = 70_000, 770, 128


def page_image(i: int) -> bytes:
    from PIL import Image, ImageDraw

    r = random.Random(i)
    w, h = 168, 224
    im = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(im)
    for _ in range(r.randint(2, 8)):  # figures, tables, banners
        x, y = r.randrange(w), r.randrange(h)
        d.rectangle([x, y, x + r.randint(8, 90), y + r.randint(4, 40)],
                    fill=tuple(r.randrange(256) for _ in range(3)))
    for _ in range(r.randint(4, 14)):  # text lines
        d.text((r.randrange(8, w // 2), r.randrange(h - 10)),
               "".join(r.choice("abcdefghijklmnopqrst 0123456789") for _ in range(r.randint(6, 20))),
               fill=(0, 0, 0))
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=85)
    return buf.getvalue()


def encode_base(n: int, work: Path):
    from retriever_server.encoders.colqwen2 import ColQwen2Encoder
    from retriever_server.encoders.tiny import build_tiny_colqwen2

    cache = work / f"base-{n}.npz"
    enc = ColQwen2Encoder(build_tiny_colqwen2(work / "tiny-colqwen2"), device="cpu", batch_size=32)
    if cache.exists():
        z = np.load(cache)
        pages = np.split(z["vectors"], z["offsets"][1:-1])
    else:
        t = time.perf_counter()
        pages = enc.encode_images([page_image(i) for i in range(n)])
        print(f"encoded {n} page images in {time.perf_counter() - t:.0f} s", flush=True)
        np.savez(cache, vectors=np.concatenate(pages),
                 offsets=np.concatenate([[0], np.cumsum([len(p) for p in pages])]))
    prompt = enc.encode_queries(["what does the table on this page report"])[0][:6]
    return pages, prompt


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def corpus(base: list[np.ndarray], n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    pages = list(base[:n])
    while len(pages) < n:
        src = base[rng.integers(len(base))]
        other = base[rng.integers(len(base))]
        p = src.copy()
        swap = rng.random(len(p)) < 0.25
        p[swap] = other[rng.integers(len(other), size=swap.sum())]
        p = p[rng.random(len(p)) >= rng.uniform(0, 0.2)]
        pages.append(unit(p + rng.normal(0, 0.02, p.shape)))
    return pages


def make_queries(pages, prompt, count: int, seed: int):
    rng = np.random.default_rng(seed)
    targets = rng.choice(len(pages), count, replace=False)
    queries = []
    for t in targets:
        rows = pages[t][rng.choice(len(pages[t]), 14, replace=False)]
        queries.append(np.concatenate([prompt, unit(rows + rng.normal(0, 0.05, rows.shape))]))
    return queries, targets


def exact_all(vectors, offsets, queries) -> np.ndarray:
    """(queries, pages) exact MaxSim by brute force, in chunks of pages."""
    out = np.empty((len(queries), len(offsets) - 1), np.float32)
    qs = np.concatenate(queries)
    qstart = np.concatenate([[0], np.cumsum([len(q) for q in queries])[:-1]])
    step = 256
    for lo in range(0, len(offsets) - 1, step):
        hi = min(lo + step, len(offsets) - 1)
        sims = qs @ vectors[offsets[lo]:offsets[hi]].T
        best = np.maximum.reduceat(sims, offsets[lo:hi] - offsets[lo], axis=1)
        out[:, lo:hi] = np.add.reduceat(best, qstart, axis=0)
    return out


def topk(scores: np.ndarray, k: int) -> list[int]:
    return list(np.lexsort((np.arange(len(scores)), -scores))[:k])


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class Exact:
    name = "exact numpy (oracle)"

    def build(self, pages, work):
        self.vectors = np.concatenate(pages)
        self.offsets = np.concatenate([[0], np.cumsum([len(p) for p in pages])])
        return self.vectors.nbytes, 0

    def search(self, queries):
        return [topk(s, TOP) for s in exact_all(self.vectors, self.offsets, queries)]


class Late:
    def __init__(self, label, **options):
        self.name, self.options = label, options

    def build(self, pages, work):
        self.index = LateInteractionIndex.from_pages(pages, **self.options)
        return self.index.first_stage_bytes + self.index.vectors.nbytes, 0

    def search(self, queries):
        return [[r for r, _ in hits] for hits in self.index.search(queries, TOP)]


class QdrantLocal:
    name = "qdrant-client local mode"

    def build(self, pages, work):
        from qdrant_client import QdrantClient, models

        self.path = work / "qdrant-local"
        shutil.rmtree(self.path, ignore_errors=True)
        self.client = QdrantClient(path=str(self.path))
        self.client.create_collection("pages", vectors_config=models.VectorParams(
            size=pages[0].shape[1], distance=models.Distance.DOT,
            multivector_config=models.MultiVectorConfig(
                comparator=models.MultiVectorComparator.MAX_SIM)))
        for lo in range(0, len(pages), 256):
            self.client.upsert("pages", [models.PointStruct(id=i, vector=pages[i].tolist())
                                         for i in range(lo, min(lo + 256, len(pages)))])
        return None, dir_bytes(self.path)

    def search(self, queries):
        from qdrant_client import models

        answers = self.client.query_batch_points("pages", [
            models.QueryRequest(query=q.tolist(), limit=TOP) for q in queries])
        return [[p.id for p in a.points] for a in answers]

    def close(self):
        self.client.close()


class QdrantEdge:
    """Qdrant's Rust engine in-process: plain (exact) or HNSW over the multi-vectors.

    HNSW: one graph node per page, MaxSim as the graph's similarity (Qdrant's multivector HNSW).
    The optimizer only indexes a segment above ``indexing_threshold`` KB (0 turns indexing off),
    so the threshold is set to 1 KB and ``optimize()`` builds the graph (blocking); ``build``
    checks that every page ended up indexed. With int8 the graph is built and searched on the
    quantized vectors; ``rescore`` re-scores ``oversampling`` x the limit with the float32
    originals.
    """

    def __init__(self, int8: bool, hnsw: bool = False, rescore: bool = False,
                 m: int = 16, ef: int = 100, oversampling: float = 2.0):
        self.int8, self.hnsw, self.rescore = int8, hnsw, rescore
        self.m, self.ef, self.oversampling = (m if hnsw else 0), ef, oversampling
        kind = f"HNSW m{m} ef{ef}" if hnsw else "plain"
        quant = (", int8 SQ" + (f" + rescore x{oversampling:g}" if rescore else "")) if int8 \
            else ", f32"
        self.name = f"qdrant engine (edge), {kind}{quant}"

    def build(self, pages, work):
        import qdrant_edge as qe

        self.path = work / f"qdrant-edge-{int(self.int8)}{'-hnsw' if self.hnsw else ''}"
        shutil.rmtree(self.path, ignore_errors=True)
        quant = qe.ScalarQuantizationConfig(qe.ScalarType.Int8, quantile=0.99,
                                            memory=qe.Memory.Pinned) if self.int8 else None
        params = qe.EdgeVectorParams(
            size=pages[0].shape[1], distance=qe.Distance.Dot, quantization_config=quant,
            multivector_config=qe.MultiVectorConfig(qe.MultiVectorComparator.MaxSim),
            hnsw_config=qe.HnswIndexConfig(m=self.m, ef_construct=self.ef, full_scan_threshold=10))
        optimizers = qe.EdgeOptimizersConfig(indexing_threshold=1) if self.hnsw else None
        self.shard = qe.EdgeShard.create(str(self.path), qe.EdgeConfig(vectors=params,
                                                                       optimizers=optimizers))
        for lo in range(0, len(pages), 256):
            self.shard.update(qe.UpdateOperation.upsert_points(
                [qe.Point(i, pages[i].tolist()) for i in range(lo, min(lo + 256, len(pages)))]))
        self.shard.optimize()  # builds the quantized storage and, with m > 0, the HNSW graph
        self.shard.flush()
        indexed = self.shard.info().indexed_vectors_count
        if self.hnsw and indexed < len(pages):
            raise RuntimeError(f"HNSW indexed {indexed} of {len(pages)} pages")
        return None, dir_bytes(self.path)

    def search(self, queries):
        import qdrant_edge as qe

        quant = qe.QuantizationSearchParams(
            rescore=self.rescore, oversampling=self.oversampling if self.rescore else None) \
            if self.int8 else None
        params = qe.SearchParams(hnsw_ef=self.ef if self.hnsw else None, quantization=quant)
        answers = self.shard.query_batch(qe.QueryBatchRequest([
            qe.QueryRequest(limit=TOP, query=qe.Query.Nearest(q.tolist()), params=params)
            for q in queries]))
        return [[int(p.id) for p in a] for a in answers]

    def close(self):
        self.shard.close()


def engines(size: int, args):
    skip = set(args.skip)
    out = [Exact()]
    if "qdrant-local" not in skip and size <= args.qdrant_local_max:
        out.append(QdrantLocal())
    try:
        import qdrant_edge  # noqa: F401
    except ImportError:
        print("qdrant-edge-py not installed: the Qdrant engine rows are left out")
    else:
        if "qdrant-plain" not in skip:
            out += [QdrantEdge(False), QdrantEdge(True)]
        if "qdrant-hnsw" not in skip:
            out.append(QdrantEdge(False, hnsw=True))
            if size <= args.qdrant_hnsw_int8_max:
                out.append(QdrantEdge(True, hnsw=True, rescore=True))
    if "first-stage" not in skip:
        out += [Late("pooled mean + MaxSim top-256", bits=0, repetitions=1, candidates=256),
                Late("FDE 8x16x32 + MaxSim top-256", bits=4, repetitions=8, candidates=256)]
    return out


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def run(size: int, base, prompt, args, work: Path) -> list[dict]:
    pages = corpus(base, size, seed=size)
    queries, targets = make_queries(pages, prompt, args.queries, seed=size + 1)
    vectors = sum(len(p) for p in pages)
    print(f"\n== {size} pages, {vectors} vectors x {pages[0].shape[1]} dims "
          f"({vectors / size:.0f} a page), {len(queries)} queries of {len(queries[0])} vectors")
    oracle = None
    rows = []
    for engine in engines(size, args):
        rss0, t = rss_mb(), time.perf_counter()
        ram, disk = engine.build(pages, work)
        build_s = time.perf_counter() - t
        rss = rss_mb() - rss0
        t = time.perf_counter()
        found = engine.search(queries)
        batch_s = time.perf_counter() - t
        per = []
        for q in queries:
            t = time.perf_counter()
            engine.search([q])
            per.append(time.perf_counter() - t)
        if oracle is None:
            oracle = found
        recall = np.mean([len(set(f) & set(o)) / TOP for f, o in zip(found, oracle)])
        hit = np.mean([t in f for f, t in zip(found, targets)])
        row = dict(size=size, engine=engine.name, build_s=build_s, ram_mb=(ram or 0) / 2**20,
                   rss_mb=rss, disk_mb=disk / 2**20, batch_s=batch_s,
                   p50_ms=1e3 * np.percentile(per, 50), p99_ms=1e3 * np.percentile(per, 99),
                   recall=recall, hit=hit)
        rows.append(row)
        print(f"  {engine.name:34s} build {build_s:6.1f} s  batch {batch_s:6.2f} s  "
              f"recall@10 {recall:.3f}  hit@10 {hit:.2f}", flush=True)
        if hasattr(engine, "close"):
            engine.close()
        del engine
    return rows


def table(rows: list[dict]) -> str:
    head = ("| pages | engine | build s | index RAM MB | RSS growth MB | disk MB | 64-query batch s "
            "| p50 ms/query | p99 ms/query | recall@10 vs exact | hit@10 |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['size']} | {r['engine']} | {r['build_s']:.1f} | {r['ram_mb']:.0f} | "
                     f"{r['rss_mb']:.0f} | {r['disk_mb']:.0f} | {r['batch_s']:.2f} | "
                     f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['recall']:.3f} | {r['hit']:.2f} |")
    return "\n".join(lines)


def extrapolate() -> str:
    n_vec = REAL_PAGES * REAL_VECTORS
    gib = 2**30
    fde = lambda dims: REAL_PAGES * dims * 2 / gib  # noqa: E731  (float16)
    rows = [
        ("multi-vectors float32 (exact; Qdrant original storage)", n_vec * REAL_DIM * 4 / gib),
        ("multi-vectors float16", n_vec * REAL_DIM * 2 / gib),
        ("multi-vectors int8 (Qdrant scalar quantization, RAM part)", n_vec * REAL_DIM / gib),
        ("multi-vectors 1 bit (Qdrant binary quantization, RAM part)", n_vec * REAL_DIM / 8 / gib),
        ("PLAID 2-bit residuals + centroid ids (2^16 centroids)",
         (n_vec * (REAL_DIM * 2 / 8 + 4) + 65536 * REAL_DIM * 4) / gib),
        ("FDE first stage 8 x 16 cells x 32 dims, float16", fde(8 * 16 * 32)),
        ("FDE first stage 16 x 32 cells x 16 dims, float16", fde(16 * 32 * 16)),
        ("pooled first stage (1 x 128), float16", fde(REAL_DIM)),
    ]
    out = [f"Extrapolation to {REAL_PAGES} pages x {REAL_VECTORS} vectors x {REAL_DIM} dims "
           f"({n_vec / 1e6:.1f} M vectors):", "| structure | GiB |", "|---|---|"]
    out += [f"| {name} | {size:.2f} |" for name, size in rows]
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000])
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--distinct", type=int, default=2000, help="page images really encoded")
    ap.add_argument("--qdrant-local-max", type=int, default=2000,
                    help="largest corpus to run qdrant-client local mode on")
    ap.add_argument("--qdrant-hnsw-int8-max", type=int, default=2000,
                    help="largest corpus to build the int8 HNSW on (its build is the slowest)")
    ap.add_argument("--skip", nargs="*", default=[],
                    choices=["qdrant-local", "qdrant-plain", "qdrant-hnsw", "first-stage"],
                    help="engine families to leave out (the exact oracle always runs)")
    ap.add_argument("--work", type=Path, help="kept between runs (caches the encoded pages)")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-dense-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    base, prompt = encode_base(min(args.distinct, max(args.sizes)), work)
    rows = []
    for size in args.sizes:
        t = time.perf_counter()
        rows += run(size, base, prompt, args, work)
        print(f"  ({size} pages: {time.perf_counter() - t:.0f} s)")
    print("\n" + table(rows) + "\n\n" + extrapolate())
    print(f"\ntotal {time.perf_counter() - t0:.0f} s on {os.cpu_count()} CPUs")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
