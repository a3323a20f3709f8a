"""`vrag-rollout evaluate-retriever`: the index alone, scored on a benchmark's questions.

Contract: `run_retriever_track(out, data=, index=, ks=, scopes=, retrievers=)` reads a converted
file as `evaluate` reads it (`evaluate_job.read_benchmark`: either layout, your own questions
too), opens the index's rankings in this process (`retrievers_of`: `bm25` for a BM25 index;
`bm25`, `dense` and `hybrid`, the fusion the server serves, for a dense one), asks each one every
question's text in each scope (corpus: the whole index; document: the question's own document,
a question without one is counted apart) for the top max(ks, 10) pages, and scores the ranking
against the gold pages (`evaluation.retriever_track`). It writes `retriever.jsonl` (a header
line, then one line per question, retriever and scope: the pages ranked and the metrics),
`retriever_report.json` and `retriever_report.md`, and returns the report. The header records
the data and its digest, the index's identity (as `evaluate` records it), the retrievers, the
scopes and the ks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

from .job_checks import JobInputError

DEPTH = 10  # ViDoRe's nDCG@10 needs ten pages
TRACK, TRACK_JSON, TRACK_MD = "retriever.jsonl", "retriever_report.json", "retriever_report.md"


def retrievers_of(index: Path) -> dict[str, Any]:
    """{name: backend} of every ranking the index supports, opened in this process."""
    from retriever_server.backends.base import open_whole

    def make(store: Any) -> dict:
        from retriever_server.backends.bm25 import Bm25Backend

        found: dict = {"bm25": Bm25Backend.from_store(store)}
        info = store.manifest.backend
        if info.get("kind") == "qdrant":
            from retriever_server.backends.fusion import HybridBackend
            from retriever_server.backends.qdrant import QdrantBackend
            from retriever_server.encoders import load_encoder, resolve_encoder

            found["dense"] = QdrantBackend.from_store(store, load_encoder(resolve_encoder(info, None)))
            found["hybrid"] = HybridBackend(found["bm25"], found["dense"], k=int(info.get("rrf_k", 60)))
        return _Opened(found)

    return open_whole(Path(index), make).backends


class _Opened:
    """The rankings of one store, closed together (what `open_whole` hands back)."""

    def __init__(self, backends: dict):
        self.backends = backends

    def close(self) -> None:
        close(self.backends)


def close(backends: dict) -> None:
    """Close each ranking once (the fusion shares the other two's connections)."""
    for name, backend in backends.items():
        if name != "hybrid":
            backend.close()


def run_retriever_track(out: Path, *, data: Path, index: Path, ks: Sequence[int] = (1, 3, 5, 10),
                        scopes: Sequence[str] = ("corpus", "document"),
                        retrievers: Optional[Sequence[str]] = None) -> dict:
    from ..core.reward import parse_ground_truth
    from ..evaluation.retrieval import gold_pages
    from ..evaluation.retriever_track import build_report, markdown, question_metrics
    from .evaluate_job import _digest, _question_ids, index_identity, read_benchmark

    samples, truths, infos = read_benchmark(Path(data))
    identity = index_identity(Path(index), None)
    available = retrievers_of(Path(index))
    try:
        chosen = list(retrievers or available)
        missing = [name for name in chosen if name not in available]
        if missing:
            raise JobInputError(f"--retriever {', '.join(missing)}: this index ranks with {', '.join(available)} "
                                "only (dense and hybrid need an index built with --encoder)")
        ids = _question_ids(Path(data), len(samples))
        header = {"data": str(Path(data).resolve()), "data_sha256": _digest(Path(data)), "index": identity,
                  "retrievers": chosen, "scopes": list(scopes), "ks": list(ks)}
        records = []
        depth = max(max(ks), DEPTH)
        for scope in scopes:
            asked = [k for k, info in enumerate(infos) if scope == "corpus" or info["document"]]
            for name in chosen:
                answers = available[name].search([samples[k].question for k in asked],
                                                 [None if scope == "corpus" else infos[k]["document"] for k in asked],
                                                 depth)
                for k, hits in zip(asked, answers):
                    truth = parse_ground_truth(truths[k])
                    gold = {(doc if doc is not None else infos[k]["document"], page) for doc, page in gold_pages(truth)}
                    ranked = [(hit.doc_id, hit.page) for hit in hits]
                    records.append({"question_id": ids[k], "set": infos[k]["set"], "retriever": name, "scope": scope,
                                    "ranked": [list(page) for page in ranked],
                                    "gold": sorted([list(page) for page in gold]),
                                    "metrics": question_metrics(ranked, gold, scope, ks)})
    finally:
        close(available)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / TRACK).open("w", encoding="utf-8") as f:
        for line in [{"header": header}, *records]:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    report = build_report(records, header)
    (out / TRACK_JSON).write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")
    (out / TRACK_MD).write_text(markdown(report), encoding="utf-8")
    return report


__all__ = ["run_retriever_track"]
