"""Build a tiny, randomly initialised ColQwen2 checkpoint offline (for tests and benchmarks).

The checkpoint has the real architecture and file layout (``ColQwen2ForRetrieval`` over a
Qwen2-VL backbone, a Qwen2 tokenizer with Qwen2-VL's special tokens, ``ColQwen2Processor``), so
``ColQwen2Encoder`` runs its real code path on it; its embeddings mean nothing. Deterministic for
a seed, built in a few seconds, a few MB on disk. The tokenizer is byte-level BPE with no merges
(one token per byte): no training data is needed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 64 * 28 * 28  # at most 64 visual tokens a page: fast on a CPU
EMBEDDING_DIM = 32


def _tokenizer():
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Qwen2Tokenizer(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[],
                         unk_token=None, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                         model_max_length=8192)
    tok.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[1:])})
    return tok


def _processor(tok):
    from transformers import ColQwen2Processor, Qwen2VLImageProcessor

    image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        patch_size=14, temporal_patch_size=2, merge_size=2)
    return ColQwen2Processor(image_processor=image_processor, tokenizer=tok)


def _model(tok, seed: int):
    import torch
    from transformers import ColQwen2Config, ColQwen2ForRetrieval, Qwen2VLConfig

    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    vlm = Qwen2VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=8192,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                          "mrope_section": [2, 3, 3]},
                         bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                         pad_token_id=ids["<|endoftext|>"]),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2,
                           in_channels=3, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    torch.manual_seed(seed)
    return ColQwen2ForRetrieval(ColQwen2Config(vlm_config=vlm, embedding_dim=EMBEDDING_DIM)).eval()


def build_tiny_colqwen2(out_dir: str | Path, *, seed: int = 0) -> Path:
    """Write the tiny checkpoint to ``out_dir`` (atomically; an existing complete one is kept)."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file() and (out_dir / "model.safetensors").is_file():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        tok = _tokenizer()
        _model(tok, seed).save_pretrained(tmp)
        _processor(tok).save_pretrained(tmp)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


if __name__ == "__main__":  # python -m retriever_server.encoders.tiny DIR
    import sys

    print(build_tiny_colqwen2(sys.argv[1]))
