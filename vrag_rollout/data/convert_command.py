"""`vrag-rollout convert-dataset`: the command around `dataset.convert_dataset` (I/O only).

Contract: `convert_dataset_command(...)` converts, prints a summary (and the index report, and a
warning naming where a kept question without its document will fail), writes the report and the
document list when asked, and returns 0, or prints one line and returns 2 on bad input: a source
that cannot be read or converted, or an `--index` that is not an index. No traceback for either.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from .dataset import ConversionReport, DatasetError, IndexDirError, convert_dataset, _shown


def convert_dataset_command(source: Path, out: Path, *, index_dir: Optional[Path] = None,
                            report_path: Optional[Path] = None, page_base: int = 1,
                            drop_missing: bool = False, action_format: str = "tags", val_out: Optional[Path] = None,
                            val_fraction: float = 0.0, split_of: str = "question", layout: str = "easyr1",
                            source_format: Optional[str] = None, documents_path: Optional[Path] = None,
                            region_action: bool = False, scope: Optional[str] = None) -> int:
    """The CLI: convert, print a summary (and the report as JSON with `report_path`, the documents
    the index must hold as JSON with `documents_path`); 2 on bad input."""
    import sys

    from .output_path import output_problem

    for flag, path in (("--out", out), ("--val-out", val_out), ("--report", report_path), ("--documents", documents_path)):
        problem = output_problem(path, flag) if path is not None else None
        if problem is not None:
            print(f"convert-dataset: {problem}", file=sys.stderr)
            return 2
    try:
        report = convert_dataset(source, out, index_dir=index_dir, page_base=page_base, drop_missing=drop_missing,
                                 action_format=action_format, val_out=val_out, val_fraction=val_fraction,
                                 split_of=split_of, layout=layout, source_format=source_format,
                                 region_action=region_action, scope=scope)
        if documents_path is not None:
            from .sources import SourceError, list_documents

            try:
                listed = [doc.to_dict() for doc in list_documents(source_format or "vidoseek", source)]
            except SourceError as error:
                raise DatasetError(error.where, error.field, error.message) from None
            Path(documents_path).write_text(json.dumps(listed, indent=1, ensure_ascii=False), encoding="utf-8")
    except IndexDirError as error:  # the index is at fault, not the source
        print(f"convert-dataset: --index {error}", file=sys.stderr)
        return 2
    except OSError as error:  # the source: missing, a directory, unreadable
        print(f"convert-dataset: {source}: {error.strerror or error}", file=sys.stderr)
        return 2
    except (DatasetError, ValueError) as error:
        print(f"convert-dataset: {source}: {error}", file=sys.stderr)
        return 2
    if report_path is not None:
        Path(report_path).write_text(json.dumps(report.to_dict(), indent=1, ensure_ascii=False), encoding="utf-8")
    _print_summary(report, out, val_out, split_of)
    if documents_path is not None:
        print(f"listed {_count(len(listed), 'document')} to index in {documents_path}")
    if report.index is not None:
        _print_index_report(report)
        _warn_kept_missing(report, report_path)
    return 0


def _count(number: int, noun: str) -> str:
    """'1 question', '2 questions'."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _print_summary(report: ConversionReport, out: Path, val_out: Optional[Path], split_of: str) -> None:
    dropped = f" ({len(report.dropped)} dropped)" if report.dropped else ""
    if val_out is None:
        print(f"wrote {report.written} of {_count(report.rows, 'question')} to {out}{dropped}")
    else:
        print(f"wrote {report.written - report.validation} of {_count(report.rows, 'question')} to {out} and "
              f"{report.validation} to {val_out} (split by {split_of}){dropped}")
    if report.scope == "corpus":
        print("scope: corpus (each question searches the whole index; --scope document searches its own document)")
    if report.unanswerable:
        print(f"{_count(report.unanswerable, 'unanswerable question')} kept (\"answerable\": false in their answer)")


def _print_index_report(report: ConversionReport) -> None:
    """What the index check found, except the questions kept without their document (`_warn_kept_missing`)."""
    gone = [item for item in report.missing_documents if item["question_id"] in report.dropped]
    if not report.missing_documents:
        print(f"every question's document is in {report.index}")
    elif gone:
        print(f"{_count(len(gone), 'question')} left out: document not in {report.index} (--drop-missing)")
    for item in gone:
        print(f"  dropped: {item['where']}: question {item['question_id']}: document {item['doc_id']!r}")
    for item in report.pages_out_of_range:
        past = [page for page in item["pages"] if page > item["num_pages"]]
        print(f"  dropped: {item['where']}: question {item['question_id']}: gold page(s) {past} past the end "
              f"of {item['doc_id']!r} ({_count(item['num_pages'], 'page')})")
    for item in report.missing_pages:
        print(f"  dropped: {item['where']}: question {item['question_id']}: gold page(s) {item['pages']} not "
              f"among the images of {item['doc_id']!r} (it lacks {_shown(item['lacking'])})")
    for gap in report.numbering_gaps:
        print(f"  gaps: {gap['doc_id']!r} has no image numbered {_shown(gap['missing'])}; its gold pages "
              f"were {gap['gold_pages']}")


SHOWN_ROWS = 10  # kept questions without their document named at the end of the run


def _warn_kept_missing(report: ConversionReport, report_path: Optional[Path]) -> None:
    """The run's last words when questions were kept whose document the index lacks: the file and
    row of each (training fails there: the rollout's retriever preflight refuses any batch holding
    one) and the flag that leaves them out. On stderr, after everything else."""
    import sys

    kept = [item for item in report.missing_documents if "file" in item]
    if not kept:
        return
    sys.stdout.flush()  # the warning comes last, also when stdout is a pipe
    lines = [f"warning: {_count(len(kept), 'question')} kept whose document is not in {report.index}; "
             "training fails on these rows:"]
    lines += [f"  {item['file']} row {item['row']}: question {item['question_id']} ({item['where']}), "
              f"document {item['doc_id']!r}" for item in kept[:SHOWN_ROWS]]
    if len(kept) > SHOWN_ROWS:
        listed = f"all in {report_path}" if report_path is not None else "--report FILE lists them all"
        lines.append(f"  and {len(kept) - SHOWN_ROWS} more ({listed})")
    lines.append("  the rollout's retriever preflight refuses any batch holding one of them (a retriever serving "
                 f"{report.index} does not serve its document). Run this command again with --drop-missing to "
                 "leave them out, or index their documents too and convert again.")
    print("\n".join(lines), file=sys.stderr)
