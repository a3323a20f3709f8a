"""What `scripts/train_easyr1.sh` checks before it starts anything: EasyR1 importable, the config
and its data files present, the retriever index built. Files only: nothing is imported or run.

Contract: `problems(config, index, overrides, root)` lists one message per problem, each naming
the fix. `config` and the data paths are resolved as EasyR1 would from `root` (the directory the
trainer runs in); `key=value` overrides of `data.train_files` / `data.val_files` replace the
config's. A data entry that is not a local file path (a Hugging Face dataset `name@split`) is
not checked. `python -m vrag_rollout.integrations.easyr1.preflight CONFIG INDEX [key=value ...]`
prints the problems and exits 2 if there are any.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

from .detect import easyr1_location

DATA_KEYS = ("train_files", "val_files")
LOCAL_SUFFIXES = (".parquet", ".json", ".jsonl", ".arrow", ".csv")
INSTALL_HINT = ("set up an environment with EasyR1 beside this project (`scripts/easyr1_recipe.sh setup`, "
                "docs/easyr1.md \"A pinned recipe\") and pass its python (PYTHON=...): EasyR1's package is also "
                "named `verl`, so PyPI's verl is not it")


def data_files(config: dict, overrides: Sequence[str]) -> dict[str, str]:
    """`data.train_files` and `data.val_files`, after the `key=value` overrides."""
    files = {key: str(value) for key, value in (config.get("data") or {}).items() if key in DATA_KEYS}
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep and key.strip() in (f"data.{k}" for k in DATA_KEYS):
            files[key.strip()[len("data."):]] = value
    return files


def problems(config: Path, index: Path, overrides: Sequence[str], root: Path,
             easyr1: Optional[Path] = None) -> list[str]:
    import yaml

    found: list[str] = []
    if (easyr1 if easyr1 is not None else easyr1_location()) is None:
        found.append(f"EasyR1 is not importable by {sys.executable}: {INSTALL_HINT}")
    if not (Path(index) / "manifest.json").is_file():
        found.append(f"{index} is not a retriever index (no manifest.json): build one with "
                     f"`vrag-retriever index PDFS --out {index}`")
    config_path = config if config.is_absolute() else root / config
    if not config_path.is_file():
        return found + [f"no config {config_path}"]
    loaded = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    files = data_files(loaded, overrides)
    for key in DATA_KEYS:
        if key not in files:
            found.append(f"{config_path}: no data.{key}")
    for key, value in files.items():
        path = Path(value) if Path(value).is_absolute() else root / value
        if value.endswith(LOCAL_SUFFIXES) and not path.is_file():
            found.append(f"data.{key}: no file {path}: write it with `vrag-rollout convert-dataset` "
                         f"(docs/easyr1.md), or pass data.{key}=PATH")
    return found


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print("usage: python -m vrag_rollout.integrations.easyr1.preflight CONFIG INDEX [key=value ...]",
              file=sys.stderr)
        return 2
    found = problems(Path(args[0]), Path(args[1]), args[2:], Path.cwd())
    for problem in found:
        print(f"train_easyr1.sh: {problem}", file=sys.stderr)
    return 2 if found else 0


if __name__ == "__main__":
    sys.exit(main())
