"""The evaluation report: the headline table by benchmark and by each set's own categories (pure).

Contract: `build_report(records, header)` turns `results.jsonl`'s records (one per sample) into a
JSON-ready dict; `markdown(report)` renders it, opening with the whole header (the setup that
reproduces the numbers: model and weights, data and bytes, index, scopes searched, grammar, every
protocol switch, judge); `headline(report)` is a line per benchmark for the terminal. Per
benchmark (`set`): how many questions and samples there were, how many samples entered the
averages (`counted`) and why the others did not (`excluded_capped`: no answer within the turn or
token budget, with `capped: exclude`; `excluded_unanswerable`, with `unanswerable: exclude`), which
rules score the set (`scoring`: its scorer's `rules`, a set's published scoring or the project's
own, as for your own questions, `questions`), the set's own headline numbers (`scores`: its
scorer's `aggregate` over the counted samples' per-question metrics; ViDoSeek's include the
judge's accuracy where a judge scored, and `unsearched`, the answers scored 0 for want of a
search, where that rule applied), and the retrieval means over the counted samples that have
gold pages (`recall`, `ndcg`, with their count; a sample without gold pages, an open-domain or
unanswerable question's, is left out of them, not counted 0, and report.md says how many).

With n samples per question (`protocol.n` > 1) `scores` is pass@1: the aggregate of each draw
(every question's sample k) averaged over the draws, so an aggregate that is not a mean
(MMLongBench-Doc's F1) stays the set's own; its counts (`COUNTS`) add up over the draws.
`pass_at_k` (k = n) holds, for each per-question metric the set reports under its own name (and
the judge's verdict as `judge_accuracy`), the mean over questions of the best of the question's
counted samples: for a 0/1 metric, whether any sample was right. A question without a counted
sample is not in it. The same table repeats per category value of every category the set's file
carries (e.g. MMLongBench-Doc's evidence sources, ViDoSeek's query types). A question in several
values of one category (MMLongBench-Doc lists several evidence sources) counts in each.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Iterable, Sequence

from .coverage import NEVER, SHOWN, coverage, split
from .efficiency import FIELDS as COST_FIELDS, summarize
from .protocol import SEARCH_REQUIRED_SETS
from .scorers import scorer_for
from .scorers.questions import NAME as OWN_QUESTIONS


# an aggregate's counts, beside its scores (not percentages)
COUNTS = ("count", "unanswered", "unsearched", "judge_count", "judge_unreadable", "answerable",
          "predicted_answerable")


PER_QUESTION_AS = {"judge": "judge_accuracy"}  # a per-question metric the aggregate names otherwise


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def pass_at_1(counted: Sequence[dict], aggregate: Callable[[list[dict]], dict]) -> dict:
    """The set's aggregate of each draw, averaged over the draws (counts summed)."""
    draws: dict[int, list[dict]] = defaultdict(list)
    for record in counted:
        draws[int(record.get("sample", 0))].append(record["metrics"])
    found = [aggregate(metrics) for _, metrics in sorted(draws.items())]
    out = {}
    for name in dict.fromkeys(name for one in found for name in one):
        values = [one[name] for one in found if name in one]
        out[name] = sum(values) if name in COUNTS else sum(values) / len(values)
    return out


def pass_at_k(counted: Sequence[dict], scores: dict, k: int) -> dict:
    """Per metric the set reports by name, the mean over questions of their best counted sample."""
    by_question: dict[str, list[dict]] = defaultdict(list)
    for record in counted:
        by_question[record["question_id"]].append(record["metrics"])
    best: dict[str, list[float]] = {}
    for metrics in by_question.values():
        for key in dict.fromkeys(key for one in metrics for key in one):
            name = PER_QUESTION_AS.get(key, key)
            if name in scores and name not in COUNTS:
                best.setdefault(name, []).append(max(one[key] for one in metrics if key in one))
    return {"k": k, "questions": len(by_question), "scores": {name: _mean(values) for name, values in best.items()}}


def summary(records: Sequence[dict], aggregate: Callable[[list[dict]], dict], k: int = 1) -> dict:
    """The numbers of one group of records (all of a set's, or one category value's)."""
    counted = [r for r in records if r["counted"]]
    row: dict[str, Any] = {
        "questions": len({r["question_id"] for r in records}), "samples": len(records), "counted": len(counted),
        "excluded_capped": sum(1 for r in records if r.get("excluded") == "capped"),
        "excluded_unanswerable": sum(1 for r in records if r.get("excluded") == "unanswerable"),
        "scores": pass_at_1(counted, aggregate) if counted else {},
    }
    if k > 1:
        row["pass_at_k"] = pass_at_k(counted, row["scores"], k)
    retrieved = [r["retrieval"] for r in counted if r.get("retrieval")]
    row["retrieval"] = {"questions": len(retrieved), "recall": _mean([m["recall"] for m in retrieved]),
                        "ndcg": _mean([m["ndcg"] for m in retrieved])}
    covered = [found for found in (r.get("coverage", coverage(r.get("retrieval"))) for r in counted) if found]
    first = [found["first_turn"] for found in covered if found["first_turn"] is not None]
    row["coverage"] = {"questions": len(covered), "gold_shown": sum(1 for found in covered if found["gold_shown"]),
                       "share": _mean([float(found["gold_shown"]) for found in covered]),
                       "first_turn_mean": _mean(first)}
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
    benchmarks, k = {}, int(header.get("protocol", {}).get("n", 1))
    for name, group in sorted(by_set.items()):
        aggregate = scorer_for(name).aggregate
        categories: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
        for record in group:
            for category, value in _category_values(record):
                categories[category][value].append(record)
        benchmarks[name] = {**summary(group, aggregate, k), "scoring": scorer_for(name).rules,
                            "by_coverage": {part: summary(members, aggregate, k)
                                            for part, members in split([r for r in group if r["counted"]]).items()},
                            "efficiency": summarize([r.get("efficiency") for r in group]),
                            "categories": {category: {value: summary(members, aggregate, k)
                                                      for value, members in sorted(values.items())}
                                           for category, values in sorted(categories.items())}}
    return {"header": header, "questions": len({r["question_id"] for r in records}), "samples": len(records),
            "benchmarks": benchmarks}


def _number(value: Any) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}" if isinstance(value, float) and 0 <= value <= 1 else str(value)


def _cost(value: Any) -> str:
    return "-" if value is None else f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


COST_NAMES = {"turns": "turns", "sampled_tokens": "sampled tokens", "visual_tokens": "visual tokens",
              "retriever_calls": "retriever calls", "seconds": "seconds"}


def _efficiency(efficiency: dict) -> list[str]:
    """Per sample: the mean and p90 of each cost (`evaluation.efficiency`)."""
    head = ["", *(COST_NAMES[name] for name in COST_FIELDS)]
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *["| " + " | ".join([stat, *(_cost(efficiency[name][stat]) for name in COST_FIELDS)]) + " |"
              for stat in ("mean", "p90")]]


def _table(rows: list[tuple[str, dict]], score_names: list[str], k: int) -> list[str]:
    best = [name for name in score_names if k > 1 and name in rows[0][1]["pass_at_k"]["scores"]]
    head = ["", "questions", *(["samples"] if k > 1 else []), "counted",
            *[f"mean@{k} {name}" if k > 1 else name for name in score_names], *[f"pass@{k} {name}" for name in best],
            "page recall", "page ndcg", "gold shown", "first hit turn"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, row in rows:
        cells = [label, str(row["questions"]), *([str(row["samples"])] if k > 1 else []), str(row["counted"]),
                 *[_number(row["scores"].get(name)) for name in score_names],
                 *[_number(row["pass_at_k"]["scores"].get(name)) for name in best],
                 _number(row["retrieval"]["recall"]), _number(row["retrieval"]["ndcg"]),
                 _number(row["coverage"]["share"]), _cost(row["coverage"]["first_turn_mean"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


GRAMMAR = {True: "on (every turn confined to a well-formed action: what makes a tiny random model act; the "
                 "actions are the grammar's as much as the model's)",
           False: "off (the model writes its own actions)"}
AS_CONVERTED = "each row's own: a doc_id searches its document, none the corpus"


SETUP_ORDER = ("model", "model_fingerprint", "data", "data_sha256", "sets", "index", "scopes", "grammar")


def _setup(header: dict) -> list[str]:
    """Every header field but the protocol, by its name (a field this list does not know too):
    what produced the numbers."""
    lines = []
    for key in sorted(header, key=lambda name: SETUP_ORDER.index(name) if name in SETUP_ORDER else len(SETUP_ORDER)):
        value = header[key]
        if key == "protocol":
            continue
        if key == "index" and isinstance(value, dict):
            shown = ", ".join(f"{name} `{item}`" for name, item in value.items())
        elif key == "grammar":
            shown = GRAMMAR[bool(value)]
        elif key == "scopes" and isinstance(value, list):
            shown = ", ".join(value) + " (the scopes the rows were searched in)"
        elif key == "sets" and isinstance(value, list):
            shown = ", ".join(f"{name} (your own questions, scored by the project's rules)"
                              if name == OWN_QUESTIONS else name for name in value)
        else:
            shown = f"`{value}`"
        lines.append(f"- `{key}`: {shown}")
    return lines


def _protocol(header: dict) -> list[str]:
    """Every protocol switch, by its name, with what a default means spelled out."""
    from .protocols import ABOUT, JUDGED

    protocol = dict(header["protocol"])
    judge = protocol.pop("judge", None)
    name, overrides = protocol.pop("name", None), protocol.pop("overrides", None) or {}
    lines = [f"- `name`: {name}: {ABOUT.get(name, '')}" if name else "- `name`: none (each switch given)"]
    _spell_budget(protocol)
    for key, value in overrides.items():
        protocol[key] = f"{protocol[key]} (overrides {name}'s {value})"
    if protocol.get("scope") is None:
        scopes = header.get("scopes")
        protocol["scope"] = f"as converted: {', '.join(scopes)} ({AS_CONVERTED})" if scopes else \
            f"as converted ({AS_CONVERTED})"
    if protocol.get("search_required", False) is None:
        protocol["search_required"] = ("as each set's protocol (VRAG-RL's rule for "
                                       f"{', '.join(SEARCH_REQUIRED_SETS)}: an answer without a search scores 0)")
    if "n" in protocol:
        protocol["n"] = f"{protocol['n']} (samples per question)"
    if protocol.get("temperature") == 0:
        protocol["temperature"] = f"{protocol['temperature']} (greedy)"
    lines += [f"- `{key}`: {value}" for key, value in protocol.items()]
    lines += [f"- `overrides`: {', '.join(overrides) if overrides else 'none'}"]
    if judge:
        weights = f" (fingerprint `{judge['fingerprint']}`)" if judge.get("fingerprint") else ""
        lines += [f"- `judge`: `{judge['model']}`{weights}, prompt `{judge['prompt_version']}`:", "", "```text",
                  judge["prompt"], "```"]
    else:
        lines += [f"- `judge`: none{' (the ' + name + ' protocol judges ViDoSeek with a model: --judge DIR)' if name in JUDGED else ''}"]
    return lines


def _spell_budget(protocol: dict) -> None:
    """The visual budget's switches (`Protocol.budget`) with what their values mean, in place; a
    header from before they existed has none of them, and gets none."""
    if protocol.get("search_page_max_pixels", 0) is None:
        protocol["search_page_max_pixels"] = "none (search results at the page band)"
    if protocol.get("visual_token_budget") == 0:
        protocol["visual_token_budget"] = "0 (no limit)"
    turns, pages = protocol.get("context_keep_turns"), protocol.get("context_keep_pages")
    if turns == 0 and pages == 0:
        protocol["context_keep_turns"] = "0 (no context edit)"
        protocol["context_keep_pages"] = "0 (no context edit)"
    elif turns is not None or pages is not None:  # edits on: each episode scored once, from its last row
        form = protocol.get("context_edit_form")
        protocol["context_edit_form"] = (f"{form} (older images become {'text stubs' if form == 'stub' else 'thumbnails'};"
                                         " an episode is several rows, scored from its last)")


def markdown(report: dict, views: Sequence[str] = ()) -> str:
    """The report as Markdown: the setup and the protocol (the whole results header), the headline
    table, then each set's categories. Scores are percentages; `page recall` and `page ndcg` are
    the retrieval means (the share of gold pages shown, and the reward's NDCG) over the counted
    samples with gold pages."""
    header = report["header"]
    k = int(header["protocol"].get("n", 1))
    lines = ["# Evaluation", "", "## Setup", "",
             "What produced these numbers (`results.jsonl`'s header: a run resumes into that file only with "
             "every field the same).", "", *_setup(header), "", "## Protocol", "", *_protocol(header)]
    if k > 1:
        lines += ["", f"mean@{k}: the set's numbers over one sample of each question, averaged over the {k} samples "
                      f"(the expected pass@1); pass@{k}: each question scores its best sample, per metric."]
    for name, bench in report["benchmarks"].items():
        scores = [key for key in bench["scores"] if key not in COUNTS]
        lines += ["", f"## {name}", ""]
        if bench.get("scoring"):
            lines += [f"Scored by {bench['scoring']}.", ""]
        parts = [(part, bench["by_coverage"][part]) for part in (SHOWN, NEVER) if part in bench.get("by_coverage", {})]
        lines += _table([("all", bench), *parts], scores, k)
        lines += ["", f"`{SHOWN}` and `{NEVER}`: the counted {'samples' if k > 1 else 'questions'} with gold pages "
                      "whose episode was shown one of them at some turn, and those never shown one (a retrieval "
                      "failure), each scored by the same rules; `first hit turn`: the mean turn whose observation "
                      "first showed a gold page."]
        if "efficiency" in bench:
            lines += ["", f"Efficiency per {'sample' if k > 1 else 'question'} (every episode; p90: nearest rank; "
                          "seconds: its share of its batch's rollout time):", "", *_efficiency(bench["efficiency"])]
        excluded = bench["excluded_capped"] + bench["excluded_unanswerable"]
        unit = "samples" if k > 1 else ""
        no_gold = bench["counted"] - bench["retrieval"]["questions"]
        if no_gold:  # said, so a reader does not take the retrieval means for all counted questions
            what = f"{'sample' if k > 1 else 'question'}{'s' if no_gold > 1 else ''}"
            lines += ["", f"{no_gold} counted {what} without a gold page {'are' if no_gold > 1 else 'is'} left out "
                          "of page recall and page ndcg (not scored 0)."]
        if excluded:
            lines += ["", f"Left out: {bench['excluded_capped']} {unit + ' ' if unit else ''}without an answer "
                          f"(capped: exclude), {bench['excluded_unanswerable']} unanswerable (unanswerable: exclude)."]
        if bench["scores"].get("unsearched"):
            lines += ["", f"Scored 0 without a search: {int(bench['scores']['unsearched'])} answers (search_required)."]
        if "judge_count" in bench["scores"]:
            lines += ["", f"Judged by the model judge: {int(bench['scores']['judge_count'])} answers, "
                          f"{int(bench['scores']['judge_unreadable'])} verdicts unreadable (counted wrong)."]
        for category, values in bench["categories"].items():
            lines += ["", f"### {name} by {category}", ""] + _table(list(values.items()), scores, k)
    if views:
        lines += ["", "## Episodes", ""] + [f"- [{view}]({view})" for view in views]
    return "\n".join(lines) + "\n"


HEADLINE = ("accuracy", "f1", "judge_accuracy")  # the numbers `headline` shows; report.md has them all


def _percent(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def headline(report: dict) -> list[str]:
    """A line per benchmark for the terminal: what counted, the headline scores (mean@k and
    pass@k with n samples), the retrieval means and the coverage."""
    k = int(report["header"]["protocol"].get("n", 1))
    lines = []
    for name, bench in report["benchmarks"].items():
        first = ", ".join(f"{key} {_percent(value)}" for key, value in bench["scores"].items() if key in HEADLINE)
        if k > 1:
            best = ", ".join(f"{key} {_percent(value)}" for key, value in bench["pass_at_k"]["scores"].items()
                             if key in HEADLINE)
            questions = f"{bench['questions']} question{'' if bench['questions'] == 1 else 's'}"
            counted = (f"{questions} x {k} samples, {bench['counted']} counted; "
                       f"mean@{k} {first}; pass@{k} {best}")
        else:
            counted = f"{bench['counted']} of {bench['questions']} questions counted; {first}"
        lines.append(f"{name}: {counted}; recall {_percent(bench['retrieval']['recall'])}, "
                     f"ndcg {_percent(bench['retrieval']['ndcg'])}, gold shown {_percent(bench['coverage']['share'])}")
    return lines
