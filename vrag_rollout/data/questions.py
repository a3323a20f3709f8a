"""Reading a converted dataset back: the questions `learn --data` and the tests roll out.

Contract: `read_questions(path, limit)` gives the first `limit` rows of a parquet that
`dataset.convert_dataset` wrote as prompt samples and their ground truths, or raises
`DatasetError` naming the file, the row and the field for a file that is not one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from .dataset import QUESTION_MARK, DatasetError


def read_questions(path: Path, limit: Optional[int] = None) -> tuple[list, list[dict]]:
    """The first `limit` rows of a parquet `convert_dataset` wrote, as prompt samples (instructions
    and question split back apart, `doc_id`) and their ground truths (the `answer` JSON)."""
    import pyarrow.parquet as pq

    from .prompts import PromptSample

    table = pq.read_table(path)
    missing = {"prompt", "answer", "doc_id"} - set(table.column_names)
    if missing:
        raise DatasetError(str(path), ",".join(sorted(missing)), "no such column: not a converted dataset "
                           "(write one with `vrag-rollout convert-dataset`)")
    rows = table.slice(0, limit).to_pylist() if limit is not None else table.to_pylist()
    samples, truths = [], []
    for number, row in enumerate(rows, start=1):
        # the first mark ends the instructions (a question may hold the mark itself)
        instructions, mark, question = str(row["prompt"]).partition(QUESTION_MARK)
        if not mark:
            raise DatasetError(f"{path}: row {number}", "prompt", f"no {QUESTION_MARK.strip()!r} line")
        try:
            truth = json.loads(row["answer"])
        except (TypeError, ValueError) as error:
            raise DatasetError(f"{path}: row {number}", "answer", f"not JSON ({error})") from error
        samples.append(PromptSample(question=question, doc_id=row["doc_id"], instructions=instructions))
        truths.append(truth)
    if not samples:
        raise DatasetError(str(path), "prompt", "no questions")
    return samples, truths
