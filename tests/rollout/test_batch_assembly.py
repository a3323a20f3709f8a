"""Pure batch assembly: position-id layouts and one retriever request per tool kind per turn."""

from dataclasses import dataclass

import pytest
import torch

from vrag_rollout.core.actions import Fetch, Search
from vrag_rollout.core.batch import BatchSpec, response_position_ids
from vrag_rollout.core.episode import Episode
from vrag_rollout.retrieval.client import RetrievedPage
from vrag_rollout.rollout.tools import ToolCall, call_retriever

PAD, VS, VE = 90, 91, 92


@dataclass
class Page:
    grid_thw: tuple
    image: str = "img"

    @property
    def num_tokens(self):
        t, h, w = self.grid_thw
        return t * h * w // 4


def episode_with_image() -> Episode:
    ep = Episode(0, [1, 2, 3], [], "doc", response_length=20, max_images=2)
    ep.response_ids = [5, 6, VS] + [PAD] * 4 + [VE, 7]
    ep.images = [Page((1, 4, 4))]
    return ep


def prompt_tensors(rows: int):
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    rope = torch.zeros((1, 3, 5), dtype=torch.long)
    rope[0, :, 2:] = torch.tensor([0, 1, 2])
    if rows == 4:
        return torch.cat([torch.tensor([[[0, 0, 0, 1, 2]]]), rope], dim=1), mask
    return rope, mask


@pytest.mark.parametrize("rows, layout, expected_rows", [(4, "auto", 4), (3, "auto", 3), (4, "3", 3), (3, "4", 4)])
def test_layouts(rows, layout, expected_rows):
    positions, mask = prompt_tensors(rows)
    spec = BatchSpec(response_length=20, pad_token_id=0, image_pad_id=PAD, merge_size=2, position_layout=layout)
    out = response_position_ids(positions, mask, [episode_with_image()], spec)
    assert out.shape == (1, expected_rows, 25)
    rope = out[0, -3:]
    # Worked by hand from the mrope rule: the response starts one past the prompt's largest
    # position (2); the 2x2 merged patches of the (1, 4, 4) image sit at 6 + (t, h, w) offsets;
    # text after it resumes at their maximum (7) + 1.
    #            5  6  VS  pads (t,h,w)   VE 7
    expected = [[3, 4, 5, 6, 6, 6, 6, 8, 9],
                [3, 4, 5, 6, 6, 7, 7, 8, 9],
                [3, 4, 5, 6, 7, 6, 7, 8, 9]]
    assert rope[:, 5:14].tolist() == expected
    assert torch.all(torch.diff(rope[:, 13:], dim=-1) == 1)  # padding continues by one
    if expected_rows == 4:
        assert torch.equal(out[0, 0, 2:], torch.arange(23))  # the text row counts every token


def test_plain_positions_continue_by_one():
    positions = torch.tensor([[0, 0, 0, 1, 2]])
    spec = BatchSpec(response_length=4, pad_token_id=0, image_pad_id=PAD, merge_size=2)
    out = response_position_ids(positions, torch.tensor([[0, 0, 1, 1, 1]]), [episode_with_image()], spec)
    assert out.tolist() == [[0, 0, 0, 1, 2, 3, 4, 5, 6]]


class CountingClient:
    def __init__(self):
        self.calls = []

    def batch_search(self, queries, doc_ids, top_n):
        self.calls.append(("search", list(queries), list(doc_ids)))
        return [[RetrievedPage(f"{d}_1", d, 1, "image", "x")] for d in doc_ids]

    def batch_fetch(self, specs, doc_ids):
        self.calls.append(("fetch", [s.wire() for s in specs], list(doc_ids)))
        return [RetrievedPage(f"{d}_{s.page}", d, s.page, s.modality, "t") for s, d in zip(specs, doc_ids)]


def test_one_request_per_tool_kind_and_outcomes_in_call_order():
    client = CountingClient()
    calls = [
        ToolCall(0, Search("a"), "d1"),
        ToolCall(1, Fetch("text", 2), "d2"),
        ToolCall(2, Search("b"), "d3"),
        ToolCall(3, Fetch("image", 1), None),  # a fetch with no document to read never reaches the server
        ToolCall(4, Fetch("image", 4), "d1"),
    ]
    outcomes = call_retriever(calls, client, top_n=2)
    assert sorted(kind for kind, *_ in client.calls) == ["fetch", "search"]
    search = next(c for c in client.calls if c[0] == "search")
    fetch = next(c for c in client.calls if c[0] == "fetch")
    assert search[1:] == (["a", "b"], ["d1", "d3"])
    assert fetch[1:] == (["text, 2", "image, 4"], ["d2", "d1"])
    assert outcomes[0][0].doc_id == "d1" and outcomes[2][0].doc_id == "d3"
    assert outcomes[1].page_id == "d2_2" and outcomes[4].page_id == "d1_4"
    # corpus scope before any page was shown: the policy's mistake (`core.scope`), not a server fault
    assert outcomes[3].kind == "request" and "search first" in outcomes[3].message
