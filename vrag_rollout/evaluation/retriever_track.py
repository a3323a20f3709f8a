"""The retriever-only track: the index scored alone on a benchmark's questions (pure).

Contract: `question_metrics(ranked, gold, scope, ks)` gives one question's metrics for one
retriever in one scope (`evaluation.retriever_metrics`): `recall@k` and `ndcg@k` for each k, and
the published definitions where their setting holds: MMDocIR's page recall (`mmdocir_recall@1`,
`@3`, `@5`) in document scope, ViDoRe's nDCG@10 (`vidore_ndcg@10`) in corpus scope.
`build_report(records, header)` averages the records (each {"retriever", "scope", "set",
"question_id", "metrics"}) per retriever, scope and set, over the questions with gold pages (the
others are counted apart: `no_gold`), and `markdown(report)` renders the header and one table per
set (a row per retriever and scope): how a user picks a retriever before rolling a policy out.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from .retriever_metrics import MMDOCIR_KS, mmdocir_page_recall, ndcg_at_k, recall_at_k, vidore_ndcg_at_10


def question_metrics(ranked: Sequence, gold: set, scope: str, ks: Sequence[int]) -> dict:
    if not gold:
        return {}
    out = {}
    for k in ks:
        out[f"recall@{k}"] = recall_at_k(ranked, gold, k)
        out[f"ndcg@{k}"] = ndcg_at_k(ranked, gold, k)
    if scope == "document":
        out.update({f"mmdocir_recall@{k}": mmdocir_page_recall(ranked, gold, k) for k in MMDOCIR_KS})
    else:
        out["vidore_ndcg@10"] = vidore_ndcg_at_10(ranked, gold)
    return out


def build_report(records: Sequence[dict], header: dict) -> dict:
    groups: dict = defaultdict(list)
    for record in records:
        groups[record["set"], record["retriever"], record["scope"]].append(record)
    tables: dict = defaultdict(list)
    for (set_name, retriever, scope), members in sorted(groups.items()):
        scored = [r["metrics"] for r in members if r["metrics"]]
        names = list(dict.fromkeys(name for one in scored for name in one))
        tables[set_name].append({"retriever": retriever, "scope": scope, "questions": len(scored),
                                 "no_gold": len(members) - len(scored),
                                 "means": {name: sum(m[name] for m in scored) / len(scored) for name in names}})
    return {"header": header, "sets": dict(tables)}


def _cell(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def markdown(report: dict) -> str:
    header = report["header"]
    lines = ["# Retriever track", "", "The index alone, asked each question's text, scored at page level "
             "(docs/evaluation.md, \"The retriever-only track\": each metric's published definition).", "",
             *[f"- `{key}`: `{value}`" for key, value in header.items()]]
    for set_name, rows in report["sets"].items():
        names = list(dict.fromkeys(name for row in rows for name in row["means"]))
        head = ["retriever", "scope", "questions", *names]
        lines += ["", f"## {set_name}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for row in rows:
            lines.append("| " + " | ".join([row["retriever"], row["scope"], str(row["questions"]),
                                            *[_cell(row["means"].get(name)) for name in names]]) + " |")
        no_gold = sum(row["no_gold"] for row in rows)
        if no_gold:
            lines += ["", f"{no_gold} question rows without a gold page left out (not scored 0)."]
    return "\n".join(lines) + "\n"
