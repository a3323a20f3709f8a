"""The guard's vectorised mrope rule (`verify/check/mrope_rule.py`) against each family's own
`get_rope_index` (the oracle), on random rows: left padding, text runs of any length (none
between two images too), images of random grids, the attention mask's holes included."""

from __future__ import annotations

import random

import pytest
import torch

from vrag_rollout.devkit.tiny_model import build_tiny_model, default_model_dir
from vrag_rollout.verify.check.mrope_rule import rule_positions
from vrag_rollout.verify.check.oracle import load_oracle


def random_row(draw: random.Random, oracle, merge: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    text = [t for t in range(50, 400)]
    ids, grids = [], []
    for _ in range(draw.randint(0, 4)):
        ids += draw.choices(text, k=draw.randint(0, 6))
        rows, cols = draw.randint(1, 7), draw.randint(1, 7)
        grids.append((1, rows * merge, cols * merge))
        ids += [oracle.vision_start] + [oracle.image_pad] * (rows * cols) + [oracle.vision_end]
    ids += draw.choices(text, k=draw.randint(1, 9))
    pad = draw.randint(0, 5)
    tail = draw.randint(0, 5)
    attention = torch.tensor([0] * pad + [1] * len(ids) + [0] * tail)
    full = torch.tensor([0] * pad + ids + [0] * tail)
    return full, attention, (torch.tensor(grids) if grids else None)


@pytest.mark.parametrize("family", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def test_the_rule_is_get_rope_index_on_random_rows(family):
    oracle = load_oracle(build_tiny_model(default_model_dir(family), family))
    merge = int(oracle.processor.image_processor.merge_size)
    draw = random.Random(family)
    for _ in range(60):
        ids, attention, grids = random_row(draw, oracle, merge)
        expected = oracle.rope_index(ids, attention, grids)
        got = rule_positions(ids, attention, grids, oracle.image_pad, merge)
        valid = attention.bool()
        assert torch.equal(got[:, valid], expected[:, valid]), (ids.tolist(), grids)


def test_the_rule_declines_what_it_does_not_cover():
    pad, merge = 9, 2
    ids = torch.tensor([1, 2, pad, pad, 3])
    ones = torch.ones(5, dtype=torch.long)
    assert rule_positions(ids, ones, None, pad, merge) is None  # pads but no grid
    assert rule_positions(ids, ones, torch.tensor([[1, 4, 4]]), pad, merge) is None  # 2 pads, 4 wanted
    assert rule_positions(ids, ones, torch.tensor([[2, 2, 2]]), pad, merge) is None  # a video-like grid
    assert rule_positions(ids, ones, torch.tensor([[1, 2, 4]]), pad, merge)[:, -1].tolist() == [4, 4, 4]
