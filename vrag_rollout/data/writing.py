"""The converted columns written out: the validation split and each trainer's parquet layout.

Contract: `convert_dataset` (`dataset.py`) builds one list per column; `split_keys` and
`in_validation` choose each row's side of a validation split (a hash of its question or document,
so the same input always splits the same way, whatever its order), `rows_where` keeps a side,
and `write_easyr1` / `write_verl` write the rows as EasyR1's dataset columns or verl's agent-loop
rows (`verl_rows`; both layouts are described in `dataset.py`'s docstring).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

PAGE_COUNT = "page_count"  # AgentRolloutConfig.page_count_key's default
EVAL = "eval"  # what `vrag-rollout evaluate` scores by (a named set's rows only)
VERL_AGENT_NAME = "vrag_agent"  # integrations/verl's registered loop


def split_keys(columns: dict, split_of: str) -> list:
    """Each row's split key: its question id, or its document (in corpus scope, the document of
    its first gold page, the question's own; a question without gold pages splits by its id)."""
    if split_of == "question":
        return columns["question_id"]
    keys = []
    for doc_id, gold, qid in zip(columns["doc_id"], columns["gold_pages"], columns["question_id"]):
        pairs = [page for page in json.loads(gold) if isinstance(page, list)]
        keys.append(doc_id if doc_id is not None else pairs[0][0] if pairs else qid)
    return keys


def in_validation(key: str, fraction: float) -> bool:
    """Whether a row with this question or document id goes to the validation split: a hash, so
    the split does not depend on the input's order or on Python's hash seed."""
    digest = int.from_bytes(hashlib.sha256(str(key).encode("utf-8")).digest()[:8], "big")
    return digest / 2**64 < fraction


def rows_where(columns: dict, keep: list) -> dict:
    return {name: [value for value, kept in zip(values, keep) if kept] for name, values in columns.items()}


def verl_rows(columns: dict, data_source: str) -> list[dict]:
    """The converted rows in verl's dataset columns (`dataset.py`'s docstring describes them)."""
    rows = []
    for i, qid in enumerate(columns["question_id"]):
        row = {"data_source": data_source, "agent_name": VERL_AGENT_NAME,
               "prompt": [{"role": "user", "content": columns["prompt"][i]}],
               "reward_model": {"ground_truth": columns["answer"][i], "style": "rule"},
               "extra_info": {"index": i, "question_id": qid, "gold_pages": columns["gold_pages"][i]},
               "doc_id": columns["doc_id"][i]}
        for name in (PAGE_COUNT, EVAL):
            if name in columns:
                row[name] = columns[name][i]
        rows.append(row)
    return rows


def write_verl(columns: dict, out: Path, data_source: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(verl_rows(columns, data_source))
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)


def write_easyr1(columns: dict, out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {PAGE_COUNT: pa.int64()}
    table = pa.table({name: pa.array(values, type=types.get(name, pa.string())) for name, values in columns.items()})
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
