"""Property tests of the pure episode logic: lengths, masks, whole images, budget."""

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrag_rollout.core.episode import Episode
from vrag_rollout.core.observation import ObservationBuilder, VisionTokens

VS, VE, PAD = 900, 901, 902  # vision start / end / image pad in the toy vocabulary


class ByteTokenizer:
    """One id per UTF-8 byte; enough to exercise the pure logic without a real tokenizer."""

    def get_vocab(self):
        return {"<|vision_start|>": VS, "<|vision_end|>": VE, "<|image_pad|>": PAD}

    def encode(self, text, add_special_tokens=False, split_special_tokens=True):
        return list(text.encode("utf-8"))


@dataclass(frozen=True)
class FakePage:
    num_tokens: int

    @property
    def grid_thw(self):
        return (1, 2, 2 * self.num_tokens)

    @property
    def image(self):
        return f"image-{self.num_tokens}"


BUILDER = ObservationBuilder(ByteTokenizer(), VisionTokens.from_tokenizer(ByteTokenizer()), max_text_tokens=40)

sampled = st.lists(st.integers(0, 255), min_size=0, max_size=60).map(lambda ids: ("sample", ids))
pages = st.lists(st.integers(1, 120), min_size=0, max_size=4).map(lambda sizes: ("pages", sizes))
texts = st.text(max_size=80).map(lambda text: ("text", text))
errors = st.text(min_size=1, max_size=30).map(lambda text: ("error", text))
steps = st.lists(st.one_of(sampled, pages, texts, errors), max_size=25)


def collapse_pad_runs(ids):
    out = []
    for token in ids:
        if token == PAD and out and out[-1] == PAD:
            continue
        out.append(token)
    return out


def pad_runs(ids):
    runs, current = [], 0
    for token in ids + [None]:
        if token == PAD:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    return runs


@settings(max_examples=300, deadline=None)
@given(steps=steps, budget=st.integers(1, 600), max_images=st.integers(0, 6))
def test_episode_invariants(steps, budget, max_images):
    episode = Episode(0, [1, 2, PAD, 3], ["prompt-image"], "doc", budget, max_images=max_images)
    expected_mask = []
    for kind, payload in steps:
        if episode.done:
            break
        before = (list(episode.response_ids), list(episode.images))
        if kind == "sample":
            episode.append_sampled(payload)
            expected_mask += [1] * min(len(payload), budget - len(before[0]))
            continue
        if kind == "pages":
            observation = BUILDER.pages([FakePage(n) for n in payload], [f"d_{n}" for n in payload],
                                        episode.remaining, episode.image_slots)
        elif kind == "text":
            observation = BUILDER.text(payload, "d_1", episode.remaining)
        else:
            observation = BUILDER.error(payload, episode.remaining)
        admitted = observation is not None and episode.append_observation(observation)
        if admitted:
            expected_mask += [0] * len(observation.trainer_ids)
            # the admitted pages are whole and best-first among those offered
            assert all(page.num_tokens in payload for page in observation.images)
        else:
            assert (episode.response_ids, episode.images) == before  # nothing half-appended
            episode.finish("budget")

        assert len(episode.response_ids) <= budget

    ids = episode.response_ids
    assert len(ids) == len(episode.loss_mask) == len(episode.logprobs) <= budget
    assert episode.loss_mask == expected_mask
    # observation tokens never carry loss
    assert all(m == 0 for t, m in zip(ids, episode.loss_mask) if t in (VS, VE, PAD))
    # every image is whole: one complete pad run per image, in order, of its own length
    assert pad_runs(ids) == [page.num_tokens for page in episode.images]
    assert ids.count(VS) == ids.count(VE) == len(episode.images)
    # the engine sees the same sequence with each pad run collapsed to one pad
    assert episode.engine_response_ids == collapse_pad_runs(ids)
    assert len(episode.prompt_images) + len(episode.images) <= max(max_images, 1)


def test_pages_fill_budget_best_first_and_count_drops():
    overhead = len(BUILDER.pages([], [], 1000, 5).trainer_ids) - len(
        "no pages found for this query.".encode()
    )
    room = 30 + 2  # one 30-token page plus its start/end tokens
    observation = BUILDER.pages([FakePage(50), FakePage(30), FakePage(10)], ["a", "b", "c"],
                                budget=overhead + room, image_slots=5)
    assert observation.page_ids == ("b",)
    assert observation.dropped_images == 2
    assert len(observation.trainer_ids) == overhead + room
    assert observation.engine_ids.count(PAD) == 1


def test_nothing_fits_means_none_and_slots_limit_gives_message():
    assert BUILDER.pages([FakePage(100)], ["a"], budget=60, image_slots=3) is None
    limited = BUILDER.pages([FakePage(1)], ["a"], budget=500, image_slots=0)
    assert limited.images == () and limited.dropped_images == 1
    assert b"image limit" in bytes(t for t in limited.trainer_ids if t < 256)


def test_text_is_cut_to_the_cap_and_budget():
    long_text = "x" * 500
    assert BUILDER.text(long_text, "p", budget=1000).trainer_ids.count(ord("x")) == 40
    small = BUILDER.text(long_text, "p", budget=len("<result></result>") + 5)
    assert small.trainer_ids.count(ord("x")) == 5
    assert BUILDER.text("abc", "p", budget=3) is None


def test_episode_refuses_work_after_it_ended():
    episode = Episode(0, [1], [], "doc", 10, max_images=1)
    episode.finish("answered")
    episode.finish("length")  # the first reason stays
    assert episode.termination == "answered"
    with pytest.raises(RuntimeError):
        episode.append_sampled([1])
    with pytest.raises(ValueError):
        Episode(0, [1], [], "doc", 10, max_images=1).finish("bogus")
