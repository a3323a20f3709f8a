"""Where a command may write a file: the trap of a mistyped `--out` path.

Contract: `output_problem(path, flag)` is None when `path` can be written as the commands do (its
directory exists, or only that last directory is missing: it is created, as for
`--out artifacts/x.pt` on a fresh clone), else one line naming the flag, the missing directory and
the fix. A path whose directory's parent is missing too (`--out /no/such/dir/x.parquet`) is far
likelier a typo than a wish for a tree of new directories, so it is refused, not created.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def output_problem(path: Path, flag: str = "--out") -> Optional[str]:
    directory = Path(path).expanduser().absolute().parent
    if directory.is_dir() or directory.parent.is_dir():
        return None
    missing = directory
    while not missing.parent.exists() and missing.parent != missing:
        missing = missing.parent
    return (f"{flag} {path}: {missing} does not exist (a mistyped path?); create the directory first "
            f"(mkdir -p {directory}) or write somewhere that exists")
