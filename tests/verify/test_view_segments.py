"""`vrag-rollout view` of a segmented batch (context edits, issue 49): an episode's rows grouped
and side by side, each edit's changes listed (which images became stubs or thumbnails), each
row's context marked out of its loss. Real rollouts of the tiny model (a search every turn, the
last turn's images kept), one per edit form; what the page says is compared with what the saved
batch holds, read here token by token."""

from __future__ import annotations

import copy
import re

import pytest

from retriever_server.sample_corpus import SAMPLE_FACTS
from tests.rollout.agent_helpers import sample_prompts
from tests.verify.helpers import roll
from tests.verify.test_view_first_screen import dom, text
from vrag_rollout.devkit.demo import DEMO_MAX_PAGE, one_of, turn_regex
from vrag_rollout.verify.saved_batch import load_rollout
from vrag_rollout.verify.view import _episodes, render
from vrag_rollout.verify.view_segments import segment_changes


def _roll(form, tiny_model_dir, tiny_processor, tiny_llm, where):
    search_only = turn_regex("tags", one_of(sorted(SAMPLE_FACTS)), DEMO_MAX_PAGE, answer=False, fetch=False)
    return roll(tiny_model_dir, tiny_processor, tiny_llm, sample_prompts(1), where / f"{form}.pt",
                context_keep_turns=1, context_edit_form=form, max_turns=4, action_regex=search_only,
                first_turn_action_regex=None, response_length=1024)


@pytest.fixture(scope="module", params=["stub", "thumbnail"])
def segmented(request, tiny_model_dir, tiny_processor, tiny_llm, tmp_path_factory):
    rollout = _roll(request.param, tiny_model_dir, tiny_processor, tiny_llm, tmp_path_factory.mktemp("segments"))
    saved = load_rollout(rollout.path)
    assert max(saved.columns["segment_index"]) >= 1, "no edit happened: nothing to view"
    return request.param, saved


def _blocks(ids: list[int], start: int, pad: int) -> list[int]:
    """Image token counts of each vision block of `ids`, in order."""
    out = []
    for i, token in enumerate(ids):
        if token == start:
            j = i + 1
            while j < len(ids) and ids[j] == pad:
                j += 1
            out.append(j - i - 1)
    return out


def _rows(saved):
    """(episode id, [rows]) in order; the batch's own columns."""
    groups: dict[int, list[int]] = {}
    for row, episode in enumerate(saved.columns["episode_id"]):
        groups.setdefault(int(episode), []).append(row)
    return list(groups.items())


def _response(saved, row: int, upto: int | None = None) -> list[int]:
    t = saved.tensors
    P = t["prompts"].shape[1]
    used = int(t["attention_mask"][row, P:].sum())
    return t["responses"][row, : used if upto is None else upto].tolist()


def test_rows_of_an_episode_are_grouped_in_order(segmented):
    _, saved = segmented
    root = dom(render(saved))
    groups = root.find_all("div", "segmented")
    expected = [(episode, rows) for episode, rows in _rows(saved) if len(rows) > 1]
    assert [g.attrs["id"] for g in groups] == [f"episode-{episode}" for episode, _ in expected]
    for group, (episode, rows) in zip(groups, expected):
        sections = group.find_all("section", "episode")
        assert [s.attrs["id"] for s in sections] == [f"ep-{row}" for row in rows]
        assert f"{len(rows)} rows" in text(group.find_all("h2")[0])
        # each row after the first says where its own turns begin, its context dimmed before that
        for section, row in zip(sections, rows):
            context = int(saved.columns["context_length"][row])
            assert len(section.find_all("span", "ctx-end")) == (1 if context else 0)
            assert bool(section.find_all("span", "ctx")) == bool(context)
            assert f"context {context}" in text(section.find_all("div", "legend")[0]) or not context
    # every row of the batch is on the page once
    assert len(root.find_all("section", "episode")) == len(saved)


def test_each_edit_lists_the_images_it_replaced(segmented):
    """The changes the page lists are the vision blocks of the earlier row that the later row's
    context holds otherwise: fewer blocks (stubs, whose text is in the context) or smaller ones
    (thumbnails), counted here from the tokens."""
    form, saved = segmented
    tt = {text: token for token, text in saved.token_text.items()}
    start, pad = tt["<|vision_start|>"], tt["<|image_pad|>"]
    root = dom(render(saved))
    checked = 0
    for group, (_, rows) in zip(root.find_all("div", "segmented"),
                                      [(e, r) for e, r in _rows(saved) if len(r) > 1]):
        lists = group.find_all("ul", "seg-changes")
        assert len(lists) == len(rows) - 1
        for changes, (before, after) in zip(lists, zip(rows, rows[1:])):
            old = _blocks(_response(saved, before), start, pad)
            context = _response(saved, after, int(saved.columns["context_length"][after]))
            new = _blocks(context, start, pad)
            items = changes.find_all("li", "seg-change")
            if form == "stub":
                assert all("stub" in item.classes for item in items)
                stubs = [text(item.find_all("code", "stub")[0]) for item in items]
                assert len(stubs) == len(old) - len(new) > 0
                decoded = "".join(saved.token_text[token] for token in context)
                assert all(stub in decoded and re.fullmatch(r"\[.+ p\.\d+, seen in turn \d+\]", stub) for stub in stubs)
            else:
                assert len(new) == len(old)
                smaller = sum(1 for a, b in zip(old, new) if a != b)
                assert all("thumbnail" in item.classes for item in items) and len(items) == smaller > 0
                for item in items:  # the image it was and the thumbnail it became, side by side
                    assert item.find_all("img", "was") and item.find_all("img", "now")
            checked += 1
    assert checked


def test_a_context_that_is_not_the_earlier_row_edited_is_flagged(segmented):
    """A sampled token of the context changed (not an edit any policy makes): the view names it."""
    saved = copy.deepcopy(segmented[1])
    _, rows = next((e, r) for e, r in _rows(saved) if len(r) > 1)
    after = rows[1]
    t = saved.tensors
    sampled = t["sampled_mask"][after].tolist()
    k = sampled.index(1)
    before = [c.kind for c in segment_changes(*[_episodes(saved, None, None)[r] for r in rows[:2]])]
    assert "other" not in before
    t["responses"][after, k] = int(t["responses"][after, k + 1])
    t["input_ids"][after, t["prompts"].shape[1] + k] = int(t["responses"][after, k + 1])
    episodes = _episodes(saved, None, None)
    for ep in episodes:  # captions are recorded while a row renders
        ep.render()
    assert [c.kind for c in segment_changes(episodes[rows[0]], episodes[after])][-1] == "other"
    assert "seg-change other" in render(saved)


def test_an_unsegmented_batch_gets_no_segment_markup(segmented):
    """Without the segment columns the page is the one it always was (no group, no context)."""
    saved = copy.deepcopy(segmented[1])
    for name in ("episode_id", "segment_index", "context_length"):
        del saved.columns[name]
    del saved.tensors["sampled_mask"]
    page = render(saved)
    assert 'class="segmented"' not in page and "ctx-end" not in page and ".seg-rows" not in page
