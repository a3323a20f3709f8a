"""Two evaluations side by side, per set and per category (pure).

Contract: `compare(a, b)` takes two runs' `report.json` contents (`evaluation.report`) and returns
{"differences": {"protocol": [...], "setup": [...]}, "sets": {set: [row, ...]}}: the header
fields the two differ in (dotted names, `results.changed_fields`: `protocol.scope`, `model`, ...),
and per set every row both reports have (`all`, `gold shown`, `never shown`, then
`<category>=<value>`), each with the samples counted and the set's scores under A and B. A
difference (`delta`, B - A) is given only when the two protocols are the same: numbers taken
under two protocols are never subtracted, and `markdown` names the differences above the tables.
`mixed(report_header, results_header)` names the fields in which a run's report and its
results file disagree: a run whose report mixes two protocols is refused by the caller.
"""

from __future__ import annotations

from typing import Optional

from .report import COUNTS
from .results import changed_fields, field_value


def _rows(bench: dict) -> dict[str, dict]:
    rows = {"all": bench, **(bench.get("by_coverage") or {})}
    for category, values in (bench.get("categories") or {}).items():
        rows.update({f"{category}={value}": row for value, row in values.items()})
    return rows


def mixed(report_header: dict, results_header: dict) -> list[str]:
    return changed_fields(report_header, results_header)


def compare(a: dict, b: dict) -> dict:
    changed = changed_fields(a["header"], b["header"])
    protocol = [name for name in changed if name.startswith("protocol.")]
    same = not protocol
    sets = {}
    for name in sorted(set(a["benchmarks"]) | set(b["benchmarks"])):
        rows_a, rows_b = _rows(a["benchmarks"].get(name, {})), _rows(b["benchmarks"].get(name, {}))
        rows = []
        for label in [label for label in rows_a if label in rows_b]:
            one, two = rows_a[label], rows_b[label]
            metrics = [m for m in one.get("scores", {}) if m in two.get("scores", {}) and m not in COUNTS]
            cells = {m: {"a": one["scores"][m], "b": two["scores"][m],
                         **({"delta": _delta(one["scores"][m], two["scores"][m])} if same else {})}
                     for m in metrics}
            rows.append({"row": label, "counted": [one.get("counted"), two.get("counted")], "scores": cells})
        sets[name] = rows
    return {"differences": {"protocol": protocol, "setup": [n for n in changed if n not in protocol]},
            "values": {name: [field_value(a["header"], name), field_value(b["header"], name)] for name in changed},
            "same_protocol": same, "sets": sets}


def _delta(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else b - a


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def markdown(result: dict, names: tuple[str, str] = ("A", "B")) -> str:
    a, b = names
    lines = [f"# {a} vs {b}", ""]
    if result["same_protocol"]:
        lines += ["Same protocol: the difference column is B - A."]
    else:
        lines += [f"Different protocols: {', '.join(result['differences']['protocol'])} "
                  "(no difference column: numbers of two protocols are not subtracted)."]
    for name in result["differences"]["protocol"] + result["differences"]["setup"]:
        one, two = result["values"][name]
        lines.append(f"- `{name}`: {one!r} in {a}, {two!r} in {b}")
    for set_name, rows in result["sets"].items():
        lines += ["", f"## {set_name}", ""]
        if not rows:
            lines.append("(in one run only)")
            continue
        metrics = list(dict.fromkeys(m for row in rows for m in row["scores"]))
        delta = result["same_protocol"]
        head = ["", f"counted {a}", f"counted {b}",
                *[f"{m} {side}" for m in metrics for side in ((a, b, "B - A") if delta else (a, b))]]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for row in rows:
            cells = [row["row"], str(row["counted"][0]), str(row["counted"][1])]
            for m in metrics:
                got = row["scores"].get(m, {})
                cells += [_pct(got.get("a")), _pct(got.get("b"))] + ([_pct(got.get("delta"))] if delta else [])
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
