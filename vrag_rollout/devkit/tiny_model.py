"""Build a tiny, randomly initialised Qwen VL model directory, offline and deterministically.

Tests, the demo and CPU benchmarks need a model of each supported family (Qwen2-VL, Qwen2.5-VL,
Qwen3-VL) that transformers and vLLM load like the released one (same architecture classes,
tokenizer class, special tokens, chat template shape, image processor geometry) but that is built
in seconds without a model hub. Nothing here is trained beyond the tokenizer. The per-family
parts live in `tiny_families`; this module holds the tokenizer and the atomic, cached build.

Two shapes, one builder (`SHAPES`, docs/tiny-models.md). Both mirror the structural traits of
the released checkpoint they copy (`tiny_families.ReleasedShape`): `vocab_size` padded past the
tokenizer by as many rows as the release pads, embeddings tied or untied as the released size,
`generation_config.json` and the processor's pixel limits as released, the added tokens in the
released order. They differ in where the special tokens sit:

- `compact` (the default: tests, demo, `learn`): the learned BPE vocabulary only, so the specials
  follow it at small ids that are *not* the released ones. Any code that hard-codes a released id
  fails on it, and an engine step samples ~1,300 logits instead of ~152,000.
- `released`: a synthetic filler vocabulary below the specials puts them at their released ids
  (`<|endoftext|>` 151643 ...) and the logits at the released width, for code whose subject is
  that width or that reads ids by value (third-party trainers, weight sync at full width).

Code must look ids up by name either way.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path

from ..families import family_by_name
from .tiny_families import TINY_FAMILIES, TinyFamily

# Bump when anything that changes the built files changes: old caches are then rebuilt.
BUILDER_VERSION = 5
MARKER_NAME = ".vrag_tiny_build.json"

BPE_VOCAB_SIZE = 1024
# The released tokenizers hold 151,643 ordinary tokens before `<|endoftext|>`: fillers make up the
# ids between the learned BPE and that count. A filler mixes letters and digits, which Qwen2's
# pre-tokenizer always splits apart, so no text ever encodes to one; each still decodes (" fill123").
RELEASED_ORDINARY_TOKENS = 151643
FILLER_PREFIX = "\u0120fill"  # byte-level spelling of " fill"

COMPACT, RELEASED = "compact", "released"
SHAPES = (COMPACT, RELEASED)

# Qwen2-VL's special tokens, in Qwen's own id order (they follow the BPE vocabulary).
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

_WORDS = (
    "search fetch image text answer think result results page pages report reports document "
    "documents manual section table figure chart annual revenue profit question query user "
    "assistant system the a an of in on to for and or is are was what which where when how "
    "find look read see shows value total year number first second third next previous "
    "page one two three four five six seven eight nine ten none found no yes not "
    "title summary appendix contents index chapter paragraph caption source retrieved "
    "company market growth sales cost price rate percent million billion data"
).split()
_TAGS = ("think", "search", "fetch", "answer", "result", "information")


def _corpus(seed: int) -> list[str]:
    """Project-generated training text: agent-protocol lines plus word salad (deterministic)."""
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(3000):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
        tag = rng.choice(_TAGS)
        if tag == "fetch":
            lines.append(f"<fetch>{rng.choice(('image', 'text'))}, {rng.randint(0, 99)}</fetch>")
        else:
            lines.append(f"<{tag}>{words}</{tag}>")
        lines.append(words.capitalize() + rng.choice((".", "?", "!", ":", ",")) + f" {rng.randint(0, 2030)}")
    lines.append("0123456789 ()[]{}<>/\\|,.;:'\"!?@#$%^&*-_=+~`\n\t")
    return lines


def _train_tokenizer(seed: int, family: TinyFamily, shape: str):
    """Byte-level BPE with Qwen2's normalizer/pre-tokenizer, wrapped as a Qwen2Tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    raw = Tokenizer(BPE())
    raw.normalizer = normalizers.NFC()
    raw.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        # All 256 byte symbols, so any text (and any sampled id) decodes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    raw.train_from_iterator(_corpus(seed), trainer=trainer)
    model = json.loads(raw.to_str())["model"]
    vocab = dict(sorted(model["vocab"].items(), key=lambda kv: kv[1]))
    if shape == RELEASED:
        vocab = _with_fillers(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]

    tok = _qwen2_tokenizer(vocab, merges)
    # Append the specials in Qwen's order (<|endoftext|> is already there, first), then make
    # <|im_end|> the EOS as in the Instruct models: chat turns end with it. (transformers 5 calls
    # the key extra_special_tokens and still takes the 4.x name.)
    tok.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    # The family's later added tokens one at a time, so each lands at its released id.
    for token, special in family.shape.added_tokens:
        tok.add_tokens([token], special_tokens=special)  # <tool_call>, <think>: whole, not special
    tok.eos_token = "<|im_end|>"
    tok.chat_template = family.chat_template
    return tok


def _with_fillers(vocab: dict) -> dict:
    """`vocab` (ids 0..n-1) extended with filler tokens up to `RELEASED_ORDINARY_TOKENS` ids."""
    learned = len(vocab)
    vocab.update({f"{FILLER_PREFIX}{i}": i for i in range(learned, RELEASED_ORDINARY_TOKENS)})
    return vocab


def _qwen2_tokenizer(vocab: dict, merges: list):
    """A Qwen2 tokenizer over this BPE: transformers 5's Qwen2Tokenizer takes vocab and merges
    directly; 4.x's (slow, file-based) does not, so there the fast one is built from the files."""
    from transformers import Qwen2Tokenizer

    settings = dict(unk_token=None, eos_token="<|endoftext|>", pad_token="<|endoftext|>", model_max_length=32768)
    try:
        return Qwen2Tokenizer(vocab=vocab, merges=merges, **settings)
    except TypeError:  # transformers < 5
        from transformers import Qwen2TokenizerFast

        with tempfile.TemporaryDirectory() as tmp:
            vocab_file, merges_file = Path(tmp) / "vocab.json", Path(tmp) / "merges.txt"
            vocab_file.write_text(json.dumps(vocab, ensure_ascii=False))
            merges_file.write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
            return Qwen2TokenizerFast(vocab_file=str(vocab_file), merges_file=str(merges_file), **settings)


def _special_ids(tok) -> dict[str, int]:
    return {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}


def released_padding(family: TinyFamily) -> int:
    """How many embedding rows the released checkpoint has past its tokenizer (279 for
    Qwen2-VL-2B: 151,936 rows for 151,657 tokens)."""
    released_tokens = RELEASED_ORDINARY_TOKENS + len(SPECIAL_TOKENS) + len(family.shape.added_tokens)
    return family.shape.vocab_size - released_tokens


def _vocab_size(family: TinyFamily, tokenizer_length: int, shape: str) -> int:
    """The embedding rows: the released count for `released`; for `compact`, the tokenizer padded
    by as many rows as the release pads (the padded rows are what the rollout must ban)."""
    if shape == RELEASED:
        return family.shape.vocab_size
    return tokenizer_length + released_padding(family)


def _build_model(family: TinyFamily, ids: dict[str, int], vocab_size: int, seed: int):
    import torch
    import transformers
    from transformers import GenerationConfig

    shape = family.shape
    config = family.build_config(ids, vocab_size, shape.tie_word_embeddings)
    config.dtype = torch.float32
    torch.manual_seed(seed)
    model = getattr(transformers, family.model_class)(config).to(torch.float32).eval()
    # The released generation_config.json: vLLM reads it by default, so its sampling defaults
    # (a repetition penalty, a low temperature) are what a rollout that forgets to set its own gets.
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
        do_sample=True,
        **shape.sampling_defaults,
    )
    return model


def _marker(seed: int, family: str, shape: str) -> dict:
    return {"builder_version": BUILDER_VERSION, "seed": seed, "family": family, "shape": shape}


def _is_complete(out_dir: Path, seed: int, family: str, shape: str) -> bool:
    try:
        marker = json.loads((out_dir / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return False
    return {key: marker.get(key) for key in ("builder_version", "seed", "family", "shape")} == _marker(seed, family, shape)


def built_shape(model_dir: str | Path) -> str | None:
    """The shape of a tiny model built here (`compact` or `released`); None for any other model."""
    try:
        return json.loads((Path(model_dir) / MARKER_NAME).read_text()).get("shape")
    except (OSError, ValueError):
        return None


def _write_marker(dir_: Path, seed: int, family: str, shape: str) -> None:
    files = sorted(p.name for p in dir_.iterdir())
    record = dict(_marker(seed, family, shape), files=files)
    tmp = dir_ / (MARKER_NAME + ".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, dir_ / MARKER_NAME)  # atomic: the marker exists only once all files do


def _build_into(dir_: Path, seed: int, family: str, shape: str) -> None:
    spec = TINY_FAMILIES[family]
    tok = _train_tokenizer(seed, spec, shape)
    ids = _special_ids(tok)
    assert len(set(ids.values())) == len(SPECIAL_TOKENS), ids
    processor = spec.build_processor(tok, spec, spec.pixel_band())
    model = _build_model(spec, ids, _vocab_size(spec, len(tok), shape), seed=seed)
    model.save_pretrained(dir_, safe_serialization=True)
    processor.save_pretrained(dir_)
    _write_marker(dir_, seed, family, shape)


def _shape_name(shape: str) -> str:
    if shape not in SHAPES:
        raise ValueError(f"unknown tiny-model shape {shape!r}: choose one of {', '.join(SHAPES)}")
    return shape


def build_tiny_model(out_dir: str | Path, family: str = "qwen2-vl", *, seed: int = 0, shape: str = COMPACT) -> Path:
    """Build (or reuse) a tiny random model of ``family`` and ``shape`` in ``out_dir``; returns the
    directory.

    Idempotent: a directory holding a complete build of this builder version, family, shape and
    seed is returned as is. Otherwise the model is built in a sibling temp dir and moved into
    place, so readers never see a half-written directory and a crashed build is simply redone.
    """
    family = family_by_name(family).name  # a clear error for unknown names
    shape = _shape_name(shape)
    out_dir = Path(out_dir).expanduser().resolve()
    if _is_complete(out_dir, seed, family, shape):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.build-", dir=out_dir.parent))
    try:
        _build_into(tmp, seed, family, shape)
        if out_dir.exists():
            if _is_complete(out_dir, seed, family, shape):  # a concurrent builder finished first
                return out_dir
            shutil.rmtree(out_dir)  # stale, half-built, or another family or shape
        try:
            os.replace(tmp, out_dir)
        except OSError:
            # Lost a race with another builder that created out_dir meanwhile.
            if not _is_complete(out_dir, seed, family, shape):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def build_tiny_qwen2vl(out_dir: str | Path, *, seed: int = 0, shape: str = COMPACT) -> Path:
    """The tiny Qwen2-VL (``build_tiny_model(out_dir, "qwen2-vl")``)."""
    return build_tiny_model(out_dir, "qwen2-vl", seed=seed, shape=shape)


def default_model_dir(family: str = "qwen2-vl", shape: str = COMPACT) -> Path:
    """``$VRAG_ROLLOUT_CACHE/tiny-<family>-<shape>-v<N>``, else under ``~/.cache/vrag-rollout``,
    the family written without dashes and dots (``tiny-qwen2vl-compact-v5``,
    ``tiny-qwen25vl-released-v5``)."""
    root = os.environ.get("VRAG_ROLLOUT_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "vrag-rollout"
    slug = family_by_name(family).name.replace("-", "").replace(".", "")
    return base / f"tiny-{slug}-{_shape_name(shape)}-v{BUILDER_VERSION}"


if __name__ == "__main__":  # python -m vrag_rollout.devkit.tiny_model [FAMILY [DIR [SHAPE]]]
    import sys

    name = sys.argv[1] if len(sys.argv) > 1 else "qwen2-vl"
    form = sys.argv[3] if len(sys.argv) > 3 else COMPACT
    print(build_tiny_model(sys.argv[2] if len(sys.argv) > 2 else default_model_dir(name, form), name, shape=form))
