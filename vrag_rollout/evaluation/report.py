"""The evaluation report: the headline table by benchmark and by each set's own categories (pure).

Contract: `build_report(records, header)` turns `results.jsonl`'s records into a JSON-
ready dict; `markdown(report)` renders it. Per benchmark (`set`): how many questions there were,
how many entered the averages (`counted`) and why the others did not (`excluded_capped`: no answer
within the turn or token budget, with `capped: exclude`; `excluded_unanswerable`, with
`unanswerable: exclude`), the set's own headline numbers (its scorer's `aggregate` over the
counted questions' per-question metrics; ViDoSeek's include the judge's accuracy where a judge
scored, and `unsearched`, the answers scored 0 for want of a search, where that rule applied),
and the retrieval means over the counted questions that have gold pages (`recall`, `ndcg`, with
their count). The same table repeats per category value of every category the set's file carries
(e.g. MMLongBench-Doc's evidence sources, ViDoSeek's query types). A question in several values
of one category (MMLongBench-Doc lists several evidence sources) counts in each.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Iterable, Sequence

from .protocol import SEARCH_REQUIRED_SETS
from .scorers import scorer_for


# an aggregate's counts, beside its scores (not percentages)
COUNTS = ("count", "unanswered", "unsearched", "judge_count", "judge_unreadable", "answerable",
          "predicted_answerable")


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summary(records: Sequence[dict], aggregate: Callable[[list[dict]], dict]) -> dict:
    """The numbers of one group of records (all of a set's, or one category value's)."""
    counted = [r for r in records if r["counted"]]
    row: dict[str, Any] = {
        "questions": len(records), "counted": len(counted),
        "excluded_capped": sum(1 for r in records if r.get("excluded") == "capped"),
        "excluded_unanswerable": sum(1 for r in records if r.get("excluded") == "unanswerable"),
        "scores": aggregate([r["metrics"] for r in counted]) if counted else {},
    }
    retrieved = [r["retrieval"] for r in counted if r.get("retrieval")]
    row["retrieval"] = {"questions": len(retrieved), "recall": _mean([m["recall"] for m in retrieved]),
                        "ndcg": _mean([m["ndcg"] for m in retrieved])}
    return row


def _category_values(record: dict) -> Iterable[tuple[str, str]]:
    for name, value in (record.get("categories") or {}).items():
        for one in (value if isinstance(value, list) else [value]):
            if one not in (None, ""):
                yield name, str(one)


def build_report(records: Sequence[dict], header: dict) -> dict:
    by_set: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_set[record["set"]].append(record)
    benchmarks = {}
    for name, group in sorted(by_set.items()):
        aggregate = scorer_for(name).aggregate
        categories: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
        for record in group:
            for category, value in _category_values(record):
                categories[category][value].append(record)
        benchmarks[name] = {**summary(group, aggregate),
                            "categories": {category: {value: summary(members, aggregate)
                                                      for value, members in sorted(values.items())}
                                           for category, values in sorted(categories.items())}}
    return {"header": header, "questions": len(records), "benchmarks": benchmarks}


def _number(value: Any) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}" if isinstance(value, float) and 0 <= value <= 1 else str(value)


def _table(rows: list[tuple[str, dict]], score_names: list[str]) -> list[str]:
    head = ["", "questions", "counted", *score_names, "page recall", "page ndcg"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, row in rows:
        cells = [label, str(row["questions"]), str(row["counted"]),
                 *[_number(row["scores"].get(name)) for name in score_names],
                 _number(row["retrieval"]["recall"]), _number(row["retrieval"]["ndcg"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(report: dict, views: Sequence[str] = ()) -> str:
    """The report as Markdown: the protocol, the headline table, then each set's categories.
    Scores are percentages; `page recall` and `page ndcg` are the retrieval means (the share of
    gold pages shown, and the reward's NDCG) over the counted questions with gold pages."""
    header = report["header"]
    lines = ["# Evaluation", "", f"Model: `{header['model']}`  ", f"Data: `{header['data']}`"]
    if header.get("index"):
        lines[-1] += "  "
        lines += ["Index: " + ", ".join(f"{key} `{value}`" for key, value in header["index"].items())]
    lines += ["", "## Protocol", ""]
    protocol = dict(header["protocol"])
    judge = protocol.pop("judge", None)
    if protocol.get("scope") is None:
        protocol["scope"] = "as converted (each row's own: a doc_id searches its document, none the corpus)"
    if protocol.get("search_required", False) is None:
        protocol["search_required"] = ("as each set's protocol (VRAG-RL's rule for "
                                       f"{', '.join(SEARCH_REQUIRED_SETS)}: an answer without a search scores 0)")
    lines += [f"- `{key}`: {value}" for key, value in protocol.items()]
    if judge:
        weights = f" (fingerprint `{judge['fingerprint']}`)" if judge.get("fingerprint") else ""
        lines += [f"- `judge`: `{judge['model']}`{weights}, prompt `{judge['prompt_version']}`:", "", "```text",
                  judge["prompt"], "```"]
    else:
        lines += ["- `judge`: none"]
    for name, bench in report["benchmarks"].items():
        scores = [key for key in bench["scores"] if key not in COUNTS]
        lines += ["", f"## {name}", ""] + _table([("all", bench)], scores)
        excluded = bench["excluded_capped"] + bench["excluded_unanswerable"]
        if excluded:
            lines += ["", f"Left out: {bench['excluded_capped']} without an answer (capped: exclude), "
                          f"{bench['excluded_unanswerable']} unanswerable (unanswerable: exclude)."]
        if bench["scores"].get("unsearched"):
            lines += ["", f"Scored 0 without a search: {int(bench['scores']['unsearched'])} answers (search_required)."]
        if "judge_count" in bench["scores"]:
            lines += ["", f"Judged by the model judge: {int(bench['scores']['judge_count'])} answers, "
                          f"{int(bench['scores']['judge_unreadable'])} verdicts unreadable (counted wrong)."]
        for category, values in bench["categories"].items():
            lines += ["", f"### {name} by {category}", ""] + _table(list(values.items()), scores)
    if views:
        lines += ["", "## Episodes", ""] + [f"- [{view}]({view})" for view in views]
    return "\n".join(lines) + "\n"
