"""Build a tiny, randomly initialised Qwen2-VL model directory, offline and deterministically.

Tests and CPU benchmarks need a model that both transformers and vLLM load like the real
Qwen2-VL (same architecture, tokenizer class, special tokens, chat template, image processor)
but that is built in seconds without a model hub. Nothing here is trained beyond the tokenizer.

Special-token ids of this tokenizer differ from real Qwen: always look them up by name.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path

# Bump when anything that changes the built files changes: old caches are then rebuilt.
BUILDER_VERSION = 1
MARKER_NAME = ".vrag_tiny_build.json"

MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 256 * 28 * 28
BPE_VOCAB_SIZE = 1024

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

# A Qwen2-VL style chat template (written for this project): images/videos render as
# <|vision_start|><|image_pad|><|vision_end|>, one pad per image; the processor/vLLM expand it.
CHAT_TEMPLATE = (
    "{%- set image_count = namespace(value=0) -%}"
    "{%- set video_count = namespace(value=0) -%}"
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "{%- set image_count.value = image_count.value + 1 -%}"
    "{%- if add_vision_id -%}{{- 'Picture ' + image_count.value|string + ': ' -}}{%- endif -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'video' or 'video' in part -%}"
    "{%- set video_count.value = video_count.value + 1 -%}"
    "{%- if add_vision_id -%}{{- 'Video ' + video_count.value|string + ': ' -}}{%- endif -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in part -%}"
    "{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
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


def _train_tokenizer(seed: int):
    """Byte-level BPE with Qwen2's normalizer/pre-tokenizer, wrapped as a Qwen2Tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers import Qwen2Tokenizer
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
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]

    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=32768,
    )
    # Append the specials in Qwen's order (<|endoftext|> is already there, first), then make
    # <|im_end|> the EOS as in Qwen2-VL-Instruct: chat turns end with it.
    tok.add_special_tokens({"extra_special_tokens": list(SPECIAL_TOKENS)})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _special_ids(tok) -> dict[str, int]:
    return {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}


def _build_processor(tok):
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    image_processor = Qwen2VLImageProcessor(size=size, patch_size=14, temporal_patch_size=2, merge_size=2)
    video_processor = Qwen2VLVideoProcessor(size=size, patch_size=14, temporal_patch_size=2, merge_size=2)
    return Qwen2VLProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )


def _build_model(ids: dict[str, int], vocab_size: int, seed: int):
    import torch
    from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    text_config = dict(
        vocab_size=vocab_size,  # exactly len(tokenizer): padded ids would be undecodable
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,  # head_dim 32: a size vLLM's CPU attention backend accepts
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        # mrope_section must sum to head_dim / 2.
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]},
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    vision_config = dict(
        depth=1,
        embed_dim=64,
        hidden_size=128,  # merger output = text hidden size
        num_heads=4,
        mlp_ratio=2,
        in_channels=3,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    config = Qwen2VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    config.dtype = torch.float32
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
    )
    return model


def _is_complete(out_dir: Path, seed: int) -> bool:
    try:
        marker = json.loads((out_dir / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("builder_version") == BUILDER_VERSION and marker.get("seed") == seed


def _write_marker(dir_: Path, seed: int) -> None:
    files = sorted(p.name for p in dir_.iterdir())
    payload = json.dumps({"builder_version": BUILDER_VERSION, "seed": seed, "files": files}, indent=1)
    tmp = dir_ / (MARKER_NAME + ".tmp")
    tmp.write_text(payload)
    os.replace(tmp, dir_ / MARKER_NAME)  # atomic: the marker exists only once all files do


def _build_into(dir_: Path, seed: int) -> None:
    tok = _train_tokenizer(seed)
    ids = _special_ids(tok)
    assert len(set(ids.values())) == len(SPECIAL_TOKENS), ids
    processor = _build_processor(tok)
    model = _build_model(ids, vocab_size=len(tok), seed=seed)
    model.save_pretrained(dir_, safe_serialization=True)
    processor.save_pretrained(dir_)
    _write_marker(dir_, seed)


def build_tiny_qwen2vl(out_dir: str | Path, *, seed: int = 0) -> Path:
    """Build (or reuse) a tiny random Qwen2-VL in ``out_dir``; returns the directory path.

    Idempotent: a directory holding a complete build of this builder version and seed is
    returned as is. Otherwise the model is built in a sibling temp dir and moved into place,
    so readers never see a half-written directory and a crashed build is simply redone.
    """
    out_dir = Path(out_dir).expanduser().resolve()
    if _is_complete(out_dir, seed):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.build-", dir=out_dir.parent))
    try:
        _build_into(tmp, seed)
        if out_dir.exists():
            if _is_complete(out_dir, seed):  # a concurrent builder finished first
                return out_dir
            shutil.rmtree(out_dir)  # stale or half-built
        try:
            os.replace(tmp, out_dir)
        except OSError:
            # Lost a race with another builder that created out_dir meanwhile.
            if not _is_complete(out_dir, seed):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def default_model_dir() -> Path:
    """``$VRAG_ROLLOUT_CACHE/tiny-qwen2vl-v<N>``, else ``~/.cache/vrag-rollout/tiny-qwen2vl-v<N>``."""
    root = os.environ.get("VRAG_ROLLOUT_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "vrag-rollout"
    return base / f"tiny-qwen2vl-v{BUILDER_VERSION}"


if __name__ == "__main__":  # python -m vrag_rollout.tiny_model [DIR]
    import sys

    print(build_tiny_qwen2vl(sys.argv[1] if len(sys.argv) > 1 else default_model_dir()))
