"""`results.jsonl`: an evaluation's per-sample results, written as they come, resumable.

Contract: the file's first line is the header `{"header": {...}}` (the protocol, the data file
and its digest, the model, ...); every other line is one sample's record (`{"question_id",
"sample", ...}`: `sample` numbers a question's samples from 0; a record without it is sample 0),
appended and flushed batch by batch, so an interrupted run loses at most the batch it was in.
`ResultsFile.open(path, header)` starts a file or resumes one:

- the records already there are kept (`done`: the questions with a record; `complete(n)`: those
  with all of samples 0..n-1); a sample recorded twice keeps its first record, read back or
  appended (a question rolled out again after a cut keeps the samples it had);
- a last line cut off mid-write is dropped (that question runs again); an unreadable line
  anywhere else is skipped and counted (`skipped`), never taken for the end of the file;
- a file written under another header (another protocol, data file, model or index) is refused
  with `ResultsMismatch`, naming every field that differs ("protocol.max_turns") and the first
  one's two values: mixing two protocols in one table is the mistake this exists to prevent;
- one run at a time: the file is locked while open (`close`); a second run on the same file is
  refused with `ResultsBusy` instead of interleaving its lines.

The header is compared as JSON values.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Iterable


class ResultsMismatch(ValueError):
    """An existing results file was written under another header (protocol, data, model, index, ...)."""


class ResultsBusy(ValueError):
    """Another evaluation is writing the same results file."""


def _lock(path: Path):
    handle = open(path.with_name(path.name + ".lock"), "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ResultsBusy(f"another evaluation is writing {path}; wait for it, or name another --out") from None
    return handle


MISSING = "(none)"  # how a field one header lacks is shown


def changed_fields(found: dict, wanted: dict, prefix: str = "") -> list[str]:
    """The dotted names of the fields two headers differ in ("protocol.max_turns", "index.version")."""
    changed = []
    for key in sorted(set(found) | set(wanted), key=str):
        old, new = found.get(key, MISSING), wanted.get(key, MISSING)
        if isinstance(old, dict) and isinstance(new, dict):
            changed += changed_fields(old, new, f"{prefix}{key}.")
        elif old != new:
            changed.append(f"{prefix}{key}")
    return changed


def field_value(header: dict, name: str):
    """The value of a dotted field of a header (`MISSING` when it has none)."""
    value = header
    for part in name.split("."):
        value = value.get(part, MISSING) if isinstance(value, dict) else MISSING
    return value


def key(record: dict) -> tuple[str, int]:
    """What identifies a record: its question and sample."""
    return record["question_id"], int(record.get("sample", 0))


class ResultsFile:
    def __init__(self, path: Path, header: dict, records: list[dict], lock, skipped: int = 0):
        self.path, self.header, self.records, self.skipped = Path(path), header, records, skipped
        self._lock = lock

    @property
    def done(self) -> set[str]:
        return {record["question_id"] for record in self.records}

    def complete(self, samples: int) -> set[str]:
        """The questions with every one of samples 0..`samples`-1 recorded."""
        have = {key(record) for record in self.records}
        return {qid for qid in self.done if all((qid, k) in have for k in range(samples))}

    @classmethod
    def open(cls, path: Path, header: dict) -> "ResultsFile":
        path = Path(path)
        header = json.loads(json.dumps(header))  # as it reads back
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = _lock(path)
        try:
            return cls._read(path, header, lock)
        except BaseException:
            lock.close()
            raise

    @classmethod
    def _read(cls, path: Path, header: dict, lock) -> "ResultsFile":
        if not path.exists() or path.stat().st_size == 0:
            path.write_text(json.dumps({"header": header}, ensure_ascii=False) + "\n", encoding="utf-8")
            return cls(path, header, [], lock)
        text = path.read_text(encoding="utf-8")
        lines = text.split("\n")
        try:
            found = json.loads(lines[0])["header"]
        except (ValueError, KeyError, TypeError):
            raise ResultsMismatch(f"{path} is not an evaluation's results file (no header line); "
                                  "name another --out") from None
        if found != header:
            changed = changed_fields(found, header)
            raise ResultsMismatch(f"{path} was written with another {', '.join(changed)} "
                                  f"({field_value(found, changed[0])!r}, now {field_value(header, changed[0])!r}); "
                                  "resume with the same settings, or name another --out")
        body = lines[1:]
        cut = not text.endswith("\n") and body and body[-1].strip()  # the write an interruption cut off
        if cut:
            body = body[:-1]
        records, seen, skipped = [], set(), 0
        for line in body:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                found_key = key(record)
            except (ValueError, KeyError, TypeError, AttributeError):
                skipped += 1
                continue
            if found_key not in seen:
                seen.add(found_key)
                records.append(record)
        if cut:  # rewrite without the cut line, so the next append starts on a line of its own
            path.write_text("\n".join([lines[0], *[line for line in body if line.strip()]]) + "\n", encoding="utf-8")
        return cls(path, header, records, lock, skipped)

    def append(self, records: Iterable[dict]) -> None:
        """Write `records` at the end, flushed to disk before returning; a sample already recorded
        keeps its first record."""
        have, kept = {key(record) for record in self.records}, []
        for record in records:
            if key(record) not in have:
                have.add(key(record))
                kept.append(record)
        records = kept
        with self.path.open("a", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.records.extend(records)

    def close(self) -> None:
        """Release the file for another run."""
        self._lock.close()

    def __enter__(self) -> "ResultsFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
