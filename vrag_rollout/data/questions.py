"""Reading a converted dataset back: the questions `learn --data` and the tests roll out.

Contract: `read_questions(path, limit)` gives the first `limit` rows of a parquet that
`dataset.convert_dataset` wrote (either layout: EasyR1's, or verl's chat-message prompts with the
ground truth in `reward_model`) as prompt samples and their ground truths, or raises
`DatasetError` naming the file, the row and the field for a file that is not one.
`written_for(samples)` says which action format (and region action) the rows' instructions were
written for, when every row carries one format's default instructions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from .dataset import QUESTION_MARK, DatasetError


def read_questions(path: Path, limit: Optional[int] = None, offset: int = 0) -> tuple[list, list[dict]]:
    """`limit` rows from row `offset` of a parquet `convert_dataset` wrote, as prompt samples
    (instructions and question split back apart, `doc_id`) and their ground truths (the `answer`
    JSON); an offset past the last row is a `DatasetError`."""
    import pyarrow.parquet as pq

    from .prompts import PromptSample

    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as error:  # pyarrow's errors for a missing or non-parquet file
        raise DatasetError(str(path), "<file>", f"not a readable parquet file ({error})") from error
    verl = "reward_model" in table.column_names
    missing = {"prompt", "reward_model" if verl else "answer", "doc_id"} - set(table.column_names)
    if missing:
        raise DatasetError(str(path), ",".join(sorted(missing)), "no such column: not a converted dataset "
                           "(write one with `vrag-rollout convert-dataset`)")
    if offset < 0:
        raise DatasetError(str(path), "<rows>", f"the offset must be 0 or more, got {offset}")
    if offset and offset >= table.num_rows:
        raise DatasetError(str(path), "<rows>", f"no questions from row {offset}: the file has {table.num_rows}")
    rows = table.slice(offset, limit).to_pylist()
    samples, truths = [], []
    for number, row in enumerate(rows, start=1):
        prompt, answer = (_verl_prompt(row["prompt"]), (row["reward_model"] or {}).get("ground_truth")) if verl \
            else (row["prompt"], row["answer"])
        # the first mark ends the instructions (a question may hold the mark itself)
        instructions, mark, question = str(prompt).partition(QUESTION_MARK)
        if not mark:
            raise DatasetError(f"{path}: row {number}", "prompt", f"no {QUESTION_MARK.strip()!r} line")
        try:
            truth = json.loads(answer)
        except (TypeError, ValueError) as error:
            raise DatasetError(f"{path}: row {number}", "answer", f"not JSON ({error})") from error
        samples.append(PromptSample(question=question, doc_id=row["doc_id"], instructions=instructions))
        truths.append(truth)
    if not samples:
        raise DatasetError(str(path), "prompt", "no questions")
    return samples, truths


def _verl_prompt(messages: object) -> str:
    """The user turn's text of a verl row's chat-message prompt ('' when it has none)."""
    turns = [m for m in (messages if isinstance(messages, (list, tuple)) else ()) if isinstance(m, dict)]
    return next((str(m.get("content", "")) for m in turns if m.get("role") == "user"), "")


def written_for(samples: list) -> Optional[tuple[str, bool]]:
    """(action_format, region_action) whose default instructions (`instructions_for` of each format)
    every sample carries, or None (instructions of the user's own, or mixed)."""
    from ..formats import FORMATS

    from ..formats.base import SCOPES

    texts = {fmt.instructions_for(region, scope): (name, region)
             for name, fmt in FORMATS.items() for region in (False, True) for scope in SCOPES}
    found = {texts[sample.instructions] for sample in samples if sample.instructions in texts}
    matched = all(sample.instructions in texts for sample in samples)
    return found.pop() if matched and len(found) == 1 else None
