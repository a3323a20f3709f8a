"""positions.py against transformers' own Qwen2-VL get_rope_index (the oracle)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vrag_rollout.core.positions import rope_positions, text_positions


@pytest.fixture(scope="module")
def oracle(tiny_model_dir):
    """The tiny model's Qwen2VLModel (its get_rope_index) and its special-token ids."""
    from transformers import AutoConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    config = AutoConfig.from_pretrained(tiny_model_dir)
    model = Qwen2VLModel(config).eval()
    ids = dict(pad=config.image_token_id, vs=config.vision_start_token_id, ve=config.vision_end_token_id)
    ids["fill"] = config.text_config.pad_token_id
    return model, ids


def hf_positions(model, input_ids: torch.Tensor, mask: torch.Tensor, grids, image_pad: int) -> torch.Tensor:
    """(3, L) positions from transformers for one (possibly left-padded) sequence."""
    # transformers 5 finds images through mm_token_type_ids (1 = image token), like its processor.
    types = (input_ids == image_pad).int()
    grid_thw = torch.tensor(grids, dtype=torch.long) if grids else None
    pos, _ = model.get_rope_index(input_ids[None], types[None], image_grid_thw=grid_thw, attention_mask=mask[None])
    return pos[:, 0]


@st.composite
def sequences(draw, merge=2):
    """(token ids, grids): text runs and 0..3 images wrapped as vision_start + pads + vision_end."""
    n_images = draw(st.integers(0, 3))
    grids = [
        (1, merge * draw(st.integers(1, 9)), merge * draw(st.integers(1, 9))) for _ in range(n_images)
    ]
    text = st.lists(st.integers(0, 700), min_size=0, max_size=8)  # plain BPE ids, below the specials
    parts = [draw(text)]
    for grid in grids:
        parts.append(("image", grid))
        parts.append(draw(text))
    left_pad = draw(st.integers(0, 5))
    start = draw(st.sampled_from([0, 0, 7, 1000]))
    return parts, grids, left_pad, start


def _flatten(parts, ids, merge=2):
    out = []
    for part in parts:
        if isinstance(part, tuple):
            t, h, w = part[1]
            out += [ids["vs"]] + [ids["pad"]] * (t * h * w // merge**2) + [ids["ve"]]
        else:
            out += part
    return out


@settings(max_examples=150, deadline=None, derandomize=True)
@given(case=sequences())
def test_matches_transformers_get_rope_index(oracle, case):
    model, ids = oracle
    parts, grids, left_pad, _ = case
    seq = _flatten(parts, ids)
    full = torch.tensor([ids["fill"]] * left_pad + seq, dtype=torch.long)
    mask = torch.tensor([0] * left_pad + [1] * len(seq), dtype=torch.long)
    if mask.sum() == 0:
        return
    expected = hf_positions(model, full, mask, grids, ids["pad"])[:, mask.bool()]
    got = rope_positions(seq, grids, image_pad_id=ids["pad"], merge_size=2)
    assert got.dtype == torch.long and got.shape == (3, len(seq))
    assert torch.equal(got, expected)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(case=sequences(), split=st.floats(0, 1))
def test_start_offset_continues_a_split_sequence(oracle, case, split):
    _, ids = oracle
    parts, grids, _, start = case
    seq = _flatten(parts, ids)
    pad = ids["pad"]
    k = round(split * len(seq))
    if 0 < k < len(seq) and seq[k - 1] == pad and seq[k] == pad:
        k = seq.index(ids["ve"], k)  # never cut through an image's pad run
    whole = rope_positions(seq, grids, image_pad_id=pad, start=start)
    n_prefix_images = sum(1 for i in range(k) if seq[i] == pad and (i == 0 or seq[i - 1] != pad))
    prefix = rope_positions(seq[:k], grids[:n_prefix_images], image_pad_id=pad, start=start)
    nxt = int(prefix.max()) + 1 if k else start
    suffix = rope_positions(seq[k:], grids[n_prefix_images:], image_pad_id=pad, start=nxt)
    assert torch.equal(torch.cat([prefix, suffix], dim=1), whole)
    assert torch.equal(whole - start, rope_positions(seq, grids, image_pad_id=pad))


def test_known_example():
    # text(2) | vs | 2x3 merged grid (6 pads) | ve | text(1)
    P = 9
    seq = [1, 2, 3, P, P, P, P, P, P, 4, 5]
    got = rope_positions(seq, [(1, 4, 6)], image_pad_id=P)
    assert got.tolist() == [
        [0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7],
        [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7],
        [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7],
    ]


def test_merge_size_one_and_tensor_input():
    P = 5
    got = rope_positions(torch.tensor([0, P, P, 1]), [(1, 1, 2)], image_pad_id=P, merge_size=1, start=3)
    assert got.tolist() == [[3, 4, 4, 6], [3, 4, 4, 6], [3, 4, 5, 6]]


@pytest.mark.parametrize(
    "seq, grids, fragment",
    [
        ([1, 9, 9, 2], [], "1 image pad run"),
        ([1, 9, 9, 2], [(1, 2, 4), (1, 2, 2)], "2 image grid"),
        ([1, 9, 9, 9, 2], [(1, 2, 4)], "has 3 tokens but grid"),
        ([1, 9, 9, 9, 9, 9, 9, 9, 9, 2], [(1, 2, 4), (1, 2, 4)], "1 image pad run"),  # two images not separated
        ([1, 9, 2], [(1, 1, 4)], "multiples of merge_size"),
        ([1, 9, 2], [(1, 0, 4)], "positive"),
    ],
)
def test_mismatched_pads_and_grids_raise(seq, grids, fragment):
    with pytest.raises(ValueError, match=fragment):
        rope_positions(seq, grids, image_pad_id=9)


def test_rejects_batched_ids():
    with pytest.raises(ValueError, match="1-D"):
        rope_positions(torch.zeros(2, 3, dtype=torch.long), [], image_pad_id=9)


def test_text_positions(oracle):
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]])
    assert text_positions(mask).tolist() == [[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 3, 3], [0, 0, 0, 0, 0, 0]]
    assert text_positions(mask).dtype == torch.long
    # Same as transformers' text positions at the real tokens of a left-padded text-only row.
    model, ids = oracle
    row = torch.tensor([ids["fill"]] * 3 + list(range(10, 20)))
    m = (torch.arange(13) >= 3).long()
    hf = hf_positions(model, row, m, [], ids["pad"])
    assert torch.equal(text_positions(m)[m.bool()], hf[0, m.bool()])
