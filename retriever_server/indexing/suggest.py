"""Commands that error messages suggest, built so that they run as printed.

Contract:

- `fresh_index_dir(folder)`: a path beside `folder` that does not exist yet, `<folder>-index`
  (then `-index-2`, `-index-3`, ...): `vrag-retriever index` writes there, where it refuses
  to replace an existing directory that is not an index.
- `holds_documents(folder)`: whether `vrag-retriever index folder` finds documents in it (PDFs,
  folders of page images), by the indexer's own discovery.
- `index_command(sources, out)`: `vrag-retriever index SRC... --out OUT`, each path quoted for
  the shell.
- `not_an_index(folder)`: for an existing folder without a manifest, why it is no index and the
  command that builds one (from the folder itself when it holds documents: a user passing their
  PDFs where an index belongs) into `fresh_index_dir(folder)`, and the `--index` to pass then;
  an index already at `<folder>-index` is named first.
- `no_index_at(path)`: why `path` is no index (it does not exist, is no directory, or
  `not_an_index`), or None when it holds a manifest file; the one wording of `serve --index`,
  `convert-dataset --index` and `record-fixtures --index`. (Messages only: `read_manifest`
  stays the cheap check that recovery runs on every build directory.)
"""

from __future__ import annotations

import shlex
from itertools import count
from pathlib import Path

from ..storage.manifest import MANIFEST_NAME


def _beside(folder: Path, suffix: str) -> Path:
    folder = Path(folder)
    if folder.name in ("", ".", ".."):  # "." has no name of its own to add a suffix to
        folder = folder.resolve()
    return folder.with_name(folder.name + suffix)


def fresh_index_dir(folder: Path) -> Path:
    for number in count(1):
        candidate = _beside(folder, "-index" if number == 1 else f"-index-{number}")
        if not candidate.exists():
            return candidate
    raise AssertionError("unreachable")


def holds_documents(folder: Path) -> bool:
    from .ingest import discover

    try:
        return bool(discover([Path(folder)]))
    except (ValueError, OSError):  # no documents, a duplicate id, an unreadable folder
        return False


def index_command(sources: list, out: Path) -> str:
    return " ".join(["vrag-retriever index", *(shlex.quote(str(src)) for src in sources),
                     "--out", shlex.quote(str(out))])


def not_an_index(folder: Path) -> str:
    out = fresh_index_dir(folder)
    then = f"then pass --index {shlex.quote(str(out))}"
    if not holds_documents(folder):
        return (f"no {MANIFEST_NAME}, so not a retriever index; build one with "
                f"`{index_command(['DOCS'], out)}` (DOCS: your PDFs or folders of page images), {then}")
    built = _beside(folder, "-index")
    if (built / MANIFEST_NAME).is_file():  # most likely indexed from this folder already
        return (f"a folder of documents, not a retriever index (no {MANIFEST_NAME}); {built} beside it is "
                f"an index: pass --index {shlex.quote(str(built))} if it is this folder's, or index the "
                f"folder anew with `{index_command([folder], out)}`, {then}")
    return (f"a folder of documents, not a retriever index (no {MANIFEST_NAME}): index it with "
            f"`{index_command([folder], out)}`, {then}")


def no_index_at(path: Path) -> str | None:
    path = Path(path)
    if not path.exists():
        return f"does not exist; build one with `{index_command(['DOCS'], path)}`"
    if not path.is_dir():
        return "not a directory; an index is the directory `vrag-retriever index` writes"
    if not (path / MANIFEST_NAME).is_file():
        return not_an_index(path)
    return None
