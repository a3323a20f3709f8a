#!/usr/bin/env python
"""Evaluate page retrieval on real manuals: plain BM25 against the page-aware ranking (and dense /
hybrid when an encoder index is given).

1. Downloads Debian documentation packages with ``apt-get download`` into ``--work`` (never into
   the repository) and unpacks them with ``dpkg-deb -x``.
2. Indexes the chosen PDFs with ``build_index``.
3. Generates questions deterministically (no randomness beyond fixed seeds):
   - *section* questions: each entry of a PDF's outline (bookmarks) whose title is unique in that
     document and has at least two content words, section numbers removed, phrased with one of a
     few fixed templates; gold = the page the bookmark points to. Entries naming the contents or
     an index are skipped (they are not sections).
   - *body* questions: one sentence (10-30 words, mostly letters, found on no other page) from
     up to ``--body-per-doc`` pages per document; gold = that page.
4. Searches every question inside its own document (top 5) and prints R@1, R@5 and NDCG@5 per
   question kind, per document set (dev = the manuals the ranking weights were tuned on,
   heldout = manuals never used for tuning), for each ranking.

Usage: python scripts/eval_retrieval.py [--work /tmp/vrag-eval] [--set dev|heldout|all]
       [--docs gnuplot,R-intro] [--encoder colqwen2:PATH [--search hybrid|dense]
       [--qdrant-url URL]] [--json results.json] [--show-misses N]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import subprocess
import tempfile
import sys
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pypdfium2 as pdfium

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retriever_server.backends.bm25 import PLAIN, Bm25Backend, tokenize  # noqa: E402
from retriever_server.indexing.indexer import build_index  # noqa: E402
from retriever_server.storage.store import PageStore  # noqa: E402

# (doc id, Debian package, path inside the package, set). Dev manuals were used to choose the
# ranking weights; held-out ones only to check them.
CORPUS = (
    ("gnuplot", "gnuplot-doc", "usr/share/doc/gnuplot/gnuplot.pdf", "dev"),
    ("R-intro", "r-doc-pdf", "usr/share/R/doc/manual/R-intro.pdf", "dev"),
    ("R-admin", "r-doc-pdf", "usr/share/R/doc/manual/R-admin.pdf", "dev"),
    ("asymptote", "asymptote-doc", "usr/share/doc/asymptote/asymptote.pdf", "dev"),
    ("R-exts", "r-doc-pdf", "usr/share/R/doc/manual/R-exts.pdf", "heldout"),
    ("debian-reference", "debian-reference-en",
     "usr/share/debian-reference/debian-reference.en.pdf", "heldout"),
    ("liboctave", "octave-doc", "usr/share/doc/octave/liboctave.pdf", "heldout"),
)
TEMPLATES = ("{t}", "how does {t} work", "what is {t}", "where is {t} explained",
             "how do I use {t}")
TOP_K = 5
_SECTION_NUMBER = re.compile(r"^(?:(?:\d+|[A-Z])(?:\.\d+)*\.?|appendix\s+[a-z]\.?:?|"
                             r"chapter\s+\d+:?|part\s+[ivx]+\.?|[IVX]+\.?)\s+", re.IGNORECASE)
_NOT_A_SECTION = re.compile(r"\b(?:contents|index)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Question:
    kind: str  # "section" or "body"
    doc_id: str
    text: str
    gold: int  # 1-based page


# -- corpus -----------------------------------------------------------------------------------
def fetch_pdfs(work: Path, docs) -> dict[str, Path]:
    """doc id -> PDF path, downloading and unpacking the packages that are not there yet."""
    debs, root = work / "debs", work / "root"
    debs.mkdir(parents=True, exist_ok=True)
    for package in sorted({d[1] for d in docs}):
        if not list(debs.glob(f"{package}_*.deb")):
            subprocess.run(["apt-get", "download", package], cwd=debs, check=True)
        deb = sorted(debs.glob(f"{package}_*.deb"))[-1]
        marker = root / f".{deb.name}.unpacked"
        if not marker.exists():
            root.mkdir(parents=True, exist_ok=True)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
            marker.touch()
    out = {}
    for doc_id, _, rel, _ in docs:
        target = work / "pdfs" / f"{doc_id}.pdf"  # the file stem becomes the doc id
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.symlink_to((root / rel).resolve())
        out[doc_id] = target
    return out


# -- questions (pure given the PDF) --------------------------------------------------------------
def clean_title(title: str) -> str:
    title = " ".join(title.split())
    title = _SECTION_NUMBER.sub("", title, count=1)
    return title.strip(" .:;")


def section_questions(doc_id: str, pdf_path: Path) -> list[Question]:
    pdf = pdfium.PdfDocument(pdf_path)
    try:
        entries = []
        for bookmark in pdf.get_toc():
            dest = bookmark.get_dest()
            if dest is None or dest.get_index() is None:
                continue
            entries.append((clean_title(bookmark.get_title() or ""), dest.get_index() + 1))
    finally:
        pdf.close()
    counts = defaultdict(int)
    for title, _ in entries:
        counts[" ".join(tokenize(title))] += 1
    out, seen = [], set()
    for title, page in entries:
        key = " ".join(tokenize(title))
        if len(tokenize(title)) < 2 or counts[key] > 1 or key in seen or _NOT_A_SECTION.search(title):
            continue
        seen.add(key)
        template = TEMPLATES[zlib.crc32(f"{doc_id}:{title}".encode()) % len(TEMPLATES)]
        out.append(Question("section", doc_id, template.format(t=title[0].lower() + title[1:]), page))
    return out


def _sentences(text: str) -> list[str]:
    flat = re.sub(r"-\n(?=[a-z])", "", text)  # undo end-of-line hyphenation
    flat = " ".join(flat.split())
    return re.split(r"(?<=[.!?])\s+(?=[A-Z])", flat)


def _usable(sentence: str) -> bool:
    words = sentence.split()
    chars = sentence.replace(" ", "")
    return (10 <= len(words) <= 30 and ". ." not in sentence and chars
            and sum(c.isalpha() for c in chars) >= 0.75 * len(chars))


def body_questions(doc_id: str, texts: list[str], per_doc: int, seed: int = 0) -> list[Question]:
    """One unique sentence from each of up to ``per_doc`` pages (seeded choice)."""
    norm = [" ".join(t.split()).lower() for t in texts]
    candidates: list[tuple[int, list[str]]] = []
    for number, text in enumerate(texts, start=1):
        usable = [s for s in _sentences(text) if _usable(s)]
        # Unique: the sentence appears on no other page of the document.
        usable = [s for s in usable
                  if sum(s.lower() in other for other in norm) == 1]
        if usable:
            candidates.append((number, usable))
    rng = random.Random(zlib.crc32(f"{seed}:{doc_id}".encode()))
    chosen = rng.sample(candidates, min(per_doc, len(candidates)))
    return [Question("body", doc_id, rng.choice(sents), page) for page, sents in sorted(chosen)]


# -- metrics (pure) ----------------------------------------------------------------------------
def metrics(ranks: list[int | None]) -> dict[str, float]:
    """R@1, R@5 and NDCG@5 of one relevant page per question (rank 1-based, None = not in top 5)."""
    n = len(ranks) or 1
    return {"n": len(ranks),
            "R@1": sum(r == 1 for r in ranks) / n,
            "R@5": sum(r is not None and r <= 5 for r in ranks) / n,
            "NDCG@5": sum(1 / math.log2(r + 1) for r in ranks if r is not None and r <= 5) / n}


def rank_of(backend, q: Question) -> int | None:
    hits = backend.search([q.text], [q.doc_id], TOP_K)[0]
    pages = [h.page for h in hits]
    return pages.index(q.gold) + 1 if q.gold in pages else None


# -- main ----------------------------------------------------------------------------------------
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "vrag-eval"),
                        help="downloads, PDFs and the index")
    parser.add_argument("--set", choices=("dev", "heldout", "all"), default="all")
    parser.add_argument("--docs", default=None, help="only these doc ids (comma-separated)")
    parser.add_argument("--body-per-doc", type=int, default=40)
    parser.add_argument("--reindex", action="store_true", help="rebuild the index")
    parser.add_argument("--encoder", default=None, help="also evaluate dense/hybrid: colqwen2:PATH")
    parser.add_argument("--qdrant-url", default=None)
    parser.add_argument("--search", choices=("hybrid", "dense"), default="hybrid",
                        help="with --encoder: the dense index's search mode")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--show-misses", type=int, default=0, help="print N missed questions")
    args = parser.parse_args(argv)

    docs = [d for d in CORPUS if args.set == "all" or d[3] == args.set]
    if args.docs:
        docs = [d for d in docs if d[0] in args.docs.split(",")]
        if not docs:
            parser.error(f"--docs: none of {args.docs} in {[d[0] for d in CORPUS]}")
    work = Path(args.work)
    pdfs = fetch_pdfs(work, docs)
    suffix = "bm25"
    if args.encoder:  # one index per encoder checkpoint and search mode
        from retriever_server.encoders import encoder_fingerprint

        suffix = f"{args.search}-{encoder_fingerprint(args.encoder).split(':')[1]}"
    index_dir = work / f"index-{args.set}-{suffix}" if not args.docs else \
        work / f"index-{args.docs.replace(',', '+')}-{suffix}"
    if args.reindex or not (index_dir / "manifest.json").exists():
        extra = {}
        if args.encoder:
            extra = {"encoder": args.encoder, "qdrant_url": args.qdrant_url, "search": args.search}
        build_index([pdfs[d[0]] for d in docs], index_dir, progress=False, **extra)
    store = PageStore.open(index_dir)

    questions: list[Question] = []
    for doc_id, *_ in docs:
        start, stop = store.doc_rows(doc_id)
        texts = [store.entry_at(r).text for r in range(start, stop)]
        questions += section_questions(doc_id, pdfs[doc_id])
        questions += body_questions(doc_id, texts, args.body_per_doc)

    systems = {"bm25 (plain)": Bm25Backend.from_store(store, ranking=PLAIN),
               "bm25 (page-aware)": Bm25Backend.from_store(store)}
    if args.encoder:
        from retriever_server.backends import open_backend

        systems[store.manifest.backend["search"]] = open_backend(index_dir)
    sets = {d[0]: d[3] for d in docs}
    results: dict = {}
    for name, backend in systems.items():
        ranks = defaultdict(list)
        misses = []
        for q in questions:
            r = rank_of(backend, q)
            for group in (sets[q.doc_id], "all"):
                ranks[(group, q.kind)].append(r)
            if r != 1:
                misses.append((q, r))
        results[name] = {f"{g}/{k}": metrics(v) for (g, k), v in sorted(ranks.items())}
        if args.show_misses:
            for q, r in misses[:args.show_misses]:
                print(f"  miss [{name}] {q.kind} {q.doc_id} gold={q.gold} rank={r}: {q.text!r}")

    print(f"{'ranking':<22} {'set/kind':<16} {'n':>4} {'R@1':>6} {'R@5':>6} {'NDCG@5':>7}")
    for name, table in results.items():
        for key, m in table.items():
            print(f"{name:<22} {key:<16} {m['n']:>4} {m['R@1']:>6.3f} {m['R@5']:>6.3f} "
                  f"{m['NDCG@5']:>7.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
