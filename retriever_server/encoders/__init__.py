"""Page and query encoders for dense (multi-vector) retrieval, behind one interface.

An encoder is named by a spec ``NAME:PATH`` (e.g. ``colqwen2:/models/colqwen2-v1.0-hf``), where
PATH is a local checkpoint directory; nothing is ever downloaded. ``load_encoder`` builds it,
``encoder_fingerprint`` identifies a checkpoint from its files without loading it (the manifest
guard compares it with the one recorded at index time).
"""

from __future__ import annotations

from pathlib import Path

from .base import PageEncoder, checkpoint_fingerprint

__all__ = ["PageEncoder", "ENCODERS", "parse_spec", "load_encoder", "encoder_fingerprint"]

ENCODERS = ("colqwen2",)


def parse_spec(spec: str) -> tuple[str, Path]:
    """``"colqwen2:PATH"`` -> ("colqwen2", PATH); ValueError with the accepted form otherwise."""
    name, sep, path = spec.partition(":")
    if not sep or not path or name not in ENCODERS:
        raise ValueError(f"encoder {spec!r}: write NAME:PATH with NAME one of {', '.join(ENCODERS)} "
                         f"and PATH a local checkpoint directory (e.g. colqwen2:/models/colqwen2)")
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ValueError(f"encoder {spec!r}: {folder} is not a checkpoint directory (no config.json)")
    return name, folder.absolute()


def encoder_fingerprint(spec: str) -> str:
    """Identity of the checkpoint a spec names, from its files (see ``checkpoint_fingerprint``)."""
    name, path = parse_spec(spec)
    return f"{name}:{checkpoint_fingerprint(path)}"


def load_encoder(spec: str, **options) -> PageEncoder:
    """The encoder a spec names (options: ``device``, ``batch_size``)."""
    name, path = parse_spec(spec)
    if name == "colqwen2":
        from .colqwen2 import ColQwen2Encoder

        return ColQwen2Encoder(path, **options)
    raise ValueError(f"unknown encoder {name!r}")  # unreachable: parse_spec checked the name
