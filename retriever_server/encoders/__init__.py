"""Page and query encoders for dense (multi-vector) retrieval, behind one interface.

An encoder is named by a spec ``NAME:PATH`` (e.g. ``colqwen2:/models/colqwen2-v1.0-hf``), where
PATH is a local checkpoint directory; nothing is ever downloaded. ``load_encoder`` builds it,
``encoder_fingerprint`` identifies a checkpoint from its files without loading it, and
``resolve_encoder``, the guard run when an index is opened, compares it with the one recorded at
index time.

- `base`: the interface (`PageEncoder`: images and queries -> multi-vectors), MaxSim, fingerprints.
- `colqwen2`: ColQwen2 / ColQwen2.5 through transformers, from a local checkpoint.
- `pipeline`: page preprocessing in worker processes, pipelined with the model.
- `batching`: queries from concurrent callers gathered into shared model calls.
- `tiny`: builds a tiny, randomly initialised ColQwen2 checkpoint offline (tests, benchmarks).
"""

from __future__ import annotations

from pathlib import Path

from .base import PageEncoder, checkpoint_fingerprint

__all__ = ["PageEncoder", "ENCODERS", "ENV_ENCODER", "EncoderMismatch", "parse_spec", "load_encoder",
           "encoder_fingerprint", "resolve_encoder"]

ENCODERS = ("colqwen2",)
ENV_ENCODER = "VRAG_RETRIEVER_ENCODER"


class EncoderMismatch(ValueError):
    """The index was built for another encoder (or for none)."""


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
    """The encoder a spec names (options: ``device``, ``batch_size``, and the speed knobs of
    ``ColQwen2Encoder``: ``prep_workers``, ``prep_depth``, ``query_batching``, ``query_batch``,
    ``query_window_s``, ``timeout_s``; see docs/encoder-speed.md)."""
    name, path = parse_spec(spec)
    if name == "colqwen2":
        from .colqwen2 import ColQwen2Encoder

        return ColQwen2Encoder(path, **options)
    raise ValueError(f"unknown encoder {name!r}")  # unreachable: parse_spec checked the name


def resolve_encoder(backend_info: dict, requested: str | None) -> str | None:
    """The encoder spec to load for an index (None for a lexical one); EncoderMismatch if not allowed.

    ``requested`` (``serve --encoder``) may point at a copy of the checkpoint elsewhere; it must
    be the same checkpoint (same fingerprint) the index was built with.
    """
    recorded = backend_info.get("encoder")
    if recorded is None:
        if requested:
            raise EncoderMismatch(f"this index was built without an encoder (BM25 only); it cannot "
                                  f"be served with encoder {requested!r}")
        return None
    spec = requested or recorded["spec"]
    try:
        found = encoder_fingerprint(spec)
    except (ValueError, OSError) as exc:
        raise EncoderMismatch(f"this index needs encoder {recorded['spec']!r} "
                              f"({recorded['fingerprint']}): {exc}") from exc
    if found != recorded["fingerprint"]:
        raise EncoderMismatch(f"this index was built for encoder {recorded['fingerprint']} "
                              f"({recorded['spec']}), but {spec} is {found}; re-index with this "
                              f"encoder or serve with the one the index was built for")
    return spec
