"""Build a tiny, randomly initialised Qwen VL model directory, offline and deterministically.

Tests, the demo and CPU benchmarks need a model of each supported family (Qwen2-VL, Qwen2.5-VL,
Qwen3-VL) that transformers and vLLM load like the released one (same architecture classes,
tokenizer class, special tokens, chat template shape, image processor geometry) but that is built
in seconds without a model hub. Nothing here is trained beyond the tokenizer. The per-family
parts live in `tiny_families`; this module holds the tokenizer and the atomic, cached build.

Release-shaped: every structural trait of the released checkpoints that code can depend on is
mirrored (`tiny_families.ReleasedShape`, docs/tiny-models.md): the special tokens sit at their
released ids (`<|endoftext|>` 151643 ...), which a synthetic filler vocabulary below them makes
possible; `vocab_size` is padded past the tokenizer as the releases pad it; embeddings are tied or
untied as the released size they copy; `generation_config.json` and the processor's pixel limits
are the released ones. Code must still look ids up by name (another family may put them elsewhere).
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
BUILDER_VERSION = 4
MARKER_NAME = ".vrag_tiny_build.json"

BPE_VOCAB_SIZE = 1024
# The released tokenizers hold 151,643 ordinary tokens before `<|endoftext|>`: fillers make up the
# ids between the learned BPE and that count. A filler mixes letters and digits, which Qwen2's
# pre-tokenizer always splits apart, so no text ever encodes to one; each still decodes (" fill123").
RELEASED_ORDINARY_TOKENS = 151643
FILLER_PREFIX = "\u0120fill"  # byte-level spelling of " fill"

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


def _train_tokenizer(seed: int, family: TinyFamily):
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
    vocab = _with_fillers(dict(sorted(model["vocab"].items(), key=lambda kv: kv[1])))
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


def _build_model(family: TinyFamily, ids: dict[str, int], seed: int):
    import torch
    import transformers
    from transformers import GenerationConfig

    shape = family.shape
    config = family.build_config(ids, shape.vocab_size, shape.tie_word_embeddings)
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


def _is_complete(out_dir: Path, seed: int, family: str) -> bool:
    try:
        marker = json.loads((out_dir / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return False
    return (
        marker.get("builder_version") == BUILDER_VERSION
        and marker.get("seed") == seed
        and marker.get("family", "qwen2-vl") == family
    )


def _write_marker(dir_: Path, seed: int, family: str) -> None:
    files = sorted(p.name for p in dir_.iterdir())
    record = {"builder_version": BUILDER_VERSION, "seed": seed, "files": files}
    if family != "qwen2-vl":  # Qwen2-VL's marker keeps its original shape (cached builds stay valid)
        record["family"] = family
    tmp = dir_ / (MARKER_NAME + ".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, dir_ / MARKER_NAME)  # atomic: the marker exists only once all files do


def _build_into(dir_: Path, seed: int, family: str) -> None:
    spec = TINY_FAMILIES[family]
    tok = _train_tokenizer(seed, spec)
    ids = _special_ids(tok)
    assert len(set(ids.values())) == len(SPECIAL_TOKENS), ids
    processor = spec.build_processor(tok, spec, spec.pixel_band())
    model = _build_model(spec, ids, seed=seed)
    model.save_pretrained(dir_, safe_serialization=True)
    processor.save_pretrained(dir_)
    _write_marker(dir_, seed, family)


def build_tiny_model(out_dir: str | Path, family: str = "qwen2-vl", *, seed: int = 0) -> Path:
    """Build (or reuse) a tiny random model of ``family`` in ``out_dir``; returns the directory.

    Idempotent: a directory holding a complete build of this builder version, family and seed
    is returned as is. Otherwise the model is built in a sibling temp dir and moved into place,
    so readers never see a half-written directory and a crashed build is simply redone.
    """
    family = family_by_name(family).name  # a clear error for unknown names
    out_dir = Path(out_dir).expanduser().resolve()
    if _is_complete(out_dir, seed, family):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.build-", dir=out_dir.parent))
    try:
        _build_into(tmp, seed, family)
        if out_dir.exists():
            if _is_complete(out_dir, seed, family):  # a concurrent builder finished first
                return out_dir
            shutil.rmtree(out_dir)  # stale, half-built or another family
        try:
            os.replace(tmp, out_dir)
        except OSError:
            # Lost a race with another builder that created out_dir meanwhile.
            if not _is_complete(out_dir, seed, family):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def build_tiny_qwen2vl(out_dir: str | Path, *, seed: int = 0) -> Path:
    """The tiny Qwen2-VL (``build_tiny_model(out_dir, "qwen2-vl")``)."""
    return build_tiny_model(out_dir, "qwen2-vl", seed=seed)


def default_model_dir(family: str = "qwen2-vl") -> Path:
    """``$VRAG_ROLLOUT_CACHE/tiny-<family>-v<N>``, else ``~/.cache/vrag-rollout/tiny-<family>-v<N>``,
    the family written without dashes and dots (``tiny-qwen2vl-v4``, ``tiny-qwen25vl-v4``)."""
    root = os.environ.get("VRAG_ROLLOUT_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "vrag-rollout"
    slug = family_by_name(family).name.replace("-", "").replace(".", "")
    return base / f"tiny-{slug}-v{BUILDER_VERSION}"


if __name__ == "__main__":  # python -m vrag_rollout.devkit.tiny_model [FAMILY [DIR]]
    import sys

    name = sys.argv[1] if len(sys.argv) > 1 else "qwen2-vl"
    print(build_tiny_model(sys.argv[2] if len(sys.argv) > 2 else default_model_dir(name), name))
