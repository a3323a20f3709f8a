"""Context edits on the real engine, every family and both action formats: each segment row is
what the engine saw (the first turn searches under a grammar, the turns after an edit sample
freely, so their rollout log-probs must equal the family's own forward pass over the row as
stored, edited context included), rows pass `check` and the live guard, and a planted broken
edit is caught."""

from __future__ import annotations

import pytest
import torch

from retriever_server.sample_corpus import SAMPLE_FACTS
from tests.rollout.agent_helpers import sample_prompts
from tests.verify.helpers import roll
from vrag_rollout.core.pages import pixels
from vrag_rollout.core.vision import processor_floor
from vrag_rollout.devkit.demo import DEMO_MAX_PAGE, one_of, turn_regex
from vrag_rollout.formats import format_named
from vrag_rollout.verify.check import check_batch
from vrag_rollout.verify.guard import Guard
from vrag_rollout.verify.saved_batch import load_rollout

QUERIES = one_of(sorted(SAMPLE_FACTS))


def free_after_search(action_format: str) -> dict:
    """A grammar on the first turn only (a search: two pages shown), free sampling after it."""
    return dict(action_format=action_format, action_regex=None, top_n=2, max_turns=3, response_length=400,
                first_turn_action_regex=turn_regex(action_format, QUERIES, DEMO_MAX_PAGE, answer=False, fetch=False))


@pytest.fixture(scope="module", params=["tags", "tool_call"])
def edited(request, family_model, tmp_path_factory):
    """keep the last page only: before turn 2 the first search's first page becomes a stub."""
    where = tmp_path_factory.mktemp(f"{family_model.family}-{request.param}")
    rollout = roll(family_model.model_dir, family_model.processor, family_model.llm, sample_prompts(2),
                   where / "edited.pt", calculate_log_probs=True, context_keep_pages=1,
                   **free_after_search(request.param))
    return family_model, rollout


def test_segment_rows_are_what_the_engine_saw(edited):
    model, rollout = edited
    columns = rollout.output.non_tensor_batch
    assert max(columns["segment_index"]) >= 1, "no edit happened: nothing was proven"
    saved = load_rollout(rollout.path)
    report = check_batch(saved, model.model_dir, forward=True)
    assert report.ok, report.human()
    # the rows after an edit sampled freely: their log-probs were compared, not excused
    assert report.forward["free_tokens"] > 0 and report.forward["free_max_gap"] < 1e-3
    assert Guard(model.model_dir, positions_fraction=1.0).inspect(rollout.output, rollout.config).ok
    # a first row claiming a context would train on none of its first tokens: named
    first = next(r for r in range(len(saved)) if saved.columns["segment_index"][r] == 0)
    saved.columns["context_length"][first] = 3
    assert any("first row has a context" in f.message for f in check_batch(saved, model.model_dir).failures)


# one family per format: the forward pass is the costly part, and the proof above covers every family
PLANTED = {("qwen2-vl", "tags"), ("qwen2.5-vl", "tool_call")}


def test_a_broken_edit_is_caught(edited):
    """A stub whose tokens differ from what the engine saw: only the row's own log-probs can tell."""
    model, rollout = edited
    if (model.family, rollout.config.action_format) not in PLANTED:
        pytest.skip("planted in one family per format")
    saved = load_rollout(rollout.path)
    columns = saved.columns
    row = next(r for r in range(len(saved)) if columns["segment_index"][r] >= 1)
    P = saved.tensors["prompts"].shape[1]
    context = int(columns["context_length"][row])
    t = saved.tensors
    stub = next(k for k in range(context) if not t["sampled_mask"][row, k] and
                int(t["responses"][row, k]) != int(t["responses"][row, k + 1]))
    other = int(t["responses"][row, stub + 1])
    for key in ("responses",):
        t[key][row, stub] = other
    t["input_ids"][row, P + stub] = other
    report = check_batch(saved, model.model_dir, forward=True)
    assert not report.ok and any(f.check == "forward" and f.sample == row for f in report.failures), report.human()


# every family and both formats run the 12-turn episode (one format per family: the rollout and
# the forward pass over a 12-turn episode's 20 rows are the costly part)
LONG = [("qwen2-vl", "tags"), ("qwen2.5-vl", "tool_call"), ("qwen3-vl", "tags")]
TURNS = 12
# Lengths that hold 12 turns: the tiny tokenizer spends about 90 tokens on a tags turn and 190 on
# a native one (its call's JSON and the tool turn around the result), and a row keeps every turn's
# text (only pages become stubs); the native format's prompt carries the tool schemas (~870
# tokens). The engine sees prompt + row: ~260 + ~1300, or ~870 + ~2300 (the session's engines
# hold 4096, tests/conftest.py).
LONG_LENGTHS = {"tags": dict(prompt_length=384, response_length=1664),
                "tool_call": dict(prompt_length=896, response_length=3200)}


def search_only(action_format: str) -> str:
    """Every turn: a short thought and one search."""
    fmt = format_named(action_format)
    prefix = fmt.call_prefix if fmt.renders_tools else ""
    return "<think>[a-z]{1,3}</think>" + prefix + fmt.regex_search(QUERIES)


@pytest.mark.parametrize("family, action_format", LONG)
def test_long_episodes_keeping_the_last_two_turns_of_images(family, action_format, family_models, tmp_path):
    """Every turn searches (a grammar): 12 turns, two pages each; only the last two turns' pages
    stay images. Each row holds at most three turns of pages (two kept, plus the turn it ends
    on), every row passes `check` with its forward pass (the grammar replayed) and the live guard,
    and the episode's rows hold every turn."""
    model = family_models(family)
    rollout = roll(model.model_dir, model.processor, model.llm, sample_prompts(1), tmp_path / "long.pt",
                   calculate_log_probs=True, action_format=action_format, action_regex=search_only(action_format),
                   first_turn_action_regex=None, top_n=2, max_turns=TURNS, context_keep_turns=2,
                   **LONG_LENGTHS[action_format])
    output = rollout.output
    columns, pad = output.non_tensor_batch, model.processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    last = [r for r in range(len(output)) if columns["termination_reason"][r] != "context_edit"]
    assert [int(columns["num_turns"][r]) for r in last] == [TURNS, TURNS], "the episodes did not run every turn"
    assert len(output) == 2 * (TURNS - 2)  # from turn 4 on, an edit before every turn: a row each
    largest_page = max(int(image.width * image.height) for m in columns["multi_modal_data"] for image in
                       (pixels(e) for e in m["images"])) // (model.processor.image_processor.patch_size
                                                            * model.processor.image_processor.merge_size) ** 2
    visual = (output.batch["responses"] == pad).sum(-1)
    assert int(visual.max()) <= 3 * 2 * largest_page
    shown = sum(len(turn) for turn in columns["page_ids"][last[0]])
    assert shown == 2 * TURNS - 2 and int(visual[last[0]]) < shown * largest_page / 2  # most pages became stubs
    # the rows are what the engine saw: every sampled token's rollout log-prob is the forward pass's
    # over the row as stored (stubs and kept pages included), each turn's grammar replayed as vLLM applied it
    report = check_batch(load_rollout(rollout.path), model.model_dir, forward=True)
    assert report.ok, report.human()
    assert report.forward["grammar_replayed"] and report.forward["tokens"] > 0
    assert report.forward["max_gap"] < 1e-3, report.human()
    assert Guard(model.model_dir, positions_fraction=1.0).inspect(output, rollout.config).ok


@pytest.mark.parametrize("family", ["qwen2-vl", "qwen3-vl"])  # Qwen3-VL: another patch size and minimum
def test_budgets_keep_one_sequence_that_check_proves(family, family_models, tmp_path):
    """Search results as thumbnails and a visual-token budget: one row an episode, every page's
    tokens and grid the processor's own, and the free turns' log-probs the forward pass's."""
    family_model = family_models(family)
    factor = family_model.processor.image_processor.patch_size * family_model.processor.image_processor.merge_size
    smallest = processor_floor(family_model.processor) // factor ** 2  # tokens of the smallest page kept
    budget = 3 * max(smallest, 16)  # the first search's two pages share it: each gets less than the band
    # a page band well above the thumbnails: pages below it must still pass (the rollout records the lowest)
    band = dict(page_min_pixels=max(48, smallest) * factor ** 2, page_max_pixels=max(64, smallest) * factor ** 2)
    rollout = roll(family_model.model_dir, family_model.processor, family_model.llm, sample_prompts(1),
                   tmp_path / "budget.pt", calculate_log_probs=True,
                   search_page_max_pixels=max(20 * factor ** 2, smallest * factor ** 2), visual_token_budget=budget,
                   **band, **free_after_search("tags"))
    output = rollout.output
    assert "episode_id" not in output.non_tensor_batch and len(output) == 2  # nothing edited: one row each
    pad = family_model.processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    shown = (output.batch["responses"] == pad).sum(-1)
    assert int(shown.max()) <= budget and int(shown.min()) > 0
    report = check_batch(load_rollout(rollout.path), family_model.model_dir, forward=True)
    assert report.ok, report.human()
    assert report.forward["free_tokens"] > 0 and report.forward["free_max_gap"] < 1e-3


def test_the_live_guard_drops_a_broken_episode_whole(edited):
    """A later row whose context no longer holds what the policy wrote: the guard names it, and
    `drop` takes every row of that episode out of the loss, no other."""
    import copy

    from vrag_rollout.verify.guard import LiveGuard

    model, rollout = edited
    batch = copy.deepcopy(rollout.output)
    columns, t = batch.non_tensor_batch, batch.batch
    row = next(r for r in range(len(batch)) if columns["segment_index"][r] >= 1)
    episode = int(columns["episode_id"][row])
    k = int(t["sampled_mask"][row].nonzero()[0])  # the context's first sampled token
    P = t["prompts"].shape[1]
    changed = (int(t["responses"][row, k]) + 1) % 50 + 10
    t["responses"][row, k] = changed
    t["input_ids"][row, P + k] = changed
    live = LiveGuard(Guard(model.model_dir, positions_fraction=1.0), "drop", config=rollout.config)
    live(batch)
    report = live.last
    assert any(f.check == "segments" and f.sample == row for f in report.failures.get(row, [])), report.lines()
    whole = [r for r in range(len(batch)) if int(columns["episode_id"][r]) == episode]
    assert sorted(report.bad_samples) == whole
    assert int(t["loss_mask"][whole].sum()) == 0
    others = [r for r in range(len(batch)) if r not in whole]
    assert torch.equal(t["loss_mask"][others], rollout.output.batch["loss_mask"][others])
