"""The engine's logit bias as a dense vector over a model's logits (a leaf: every layer uses it).

Contract: `dense_logit_bias(bias, width)` is a (width,) float32 vector, zero except at the ids of
`bias`, where it holds their values. `width` is the logits' own last dimension: released Qwen VL
checkpoints pad the embedding past the tokenizer (151936 or 152064 rows for about 151,665 tokens),
so a vector sized by `len(tokenizer)` cannot be added to their logits. An id outside the logits is
an error (a bias recorded for another model), never silently dropped.
"""

from __future__ import annotations

from typing import Any, Mapping


def dense_logit_bias(bias: Mapping[int, float], width: int, device: Any = None) -> Any:
    import torch

    vector = torch.zeros(int(width), dtype=torch.float32, device=device)
    if not bias:
        return vector
    ids = [int(token) for token in bias]
    outside = [token for token in ids if not 0 <= token < width]
    if outside:
        raise ValueError(f"logit bias for token ids {sorted(outside)[:5]} outside the model's {width} logits: "
                         "recorded for another model?")
    vector[torch.tensor(ids, device=device)] = torch.tensor([float(v) for v in bias.values()], device=device)
    return vector


__all__ = ["dense_logit_bias"]
