"""Property tests of context edits (pure): whatever the turns, the policy and the form, an edit
changes no sampled token, keeps the engine and trainer views one image for one image, leaves
only what the policy keeps, and closes a segment only when it changed something."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.rollout.test_episode_properties import BUILDER, PAD, VE, VS, FakePage, collapse_pad_runs, pad_runs
from vrag_rollout.core.context_edit import STUB, THUMBNAIL, ContextEditor, ContextPolicy, stub_text
from vrag_rollout.core.episode import Episode

turns = st.lists(st.tuples(st.lists(st.integers(0, 255), min_size=1, max_size=12),
                           st.lists(st.integers(1, 40), max_size=3)), min_size=1, max_size=10)
policies = st.builds(ContextPolicy, keep_turns=st.integers(0, 3), keep_pages=st.integers(0, 4),
                     form=st.sampled_from([STUB, THUMBNAIL]), slack=st.integers(0, 2))


def editor(policy: ContextPolicy) -> ContextEditor:
    return ContextEditor(policy, VS, VE, PAD, encode=BUILDER.encode_text,
                         thumbnail=lambda page: FakePage(max(1, page.num_tokens // 4)))


def sampled_with_turns(ids, mask, turn_ids, end=None):
    return [(t, turn) for t, m, turn in list(zip(ids, mask, turn_ids))[:end] if m]


def run(episode: Episode, edits: ContextEditor, script) -> list:
    """Each turn: edit (as the driver does before a turn), sample, observe; the segments' checks."""
    written = []  # every sampled token with its turn, in order
    for step, (ids, sizes) in enumerate(script):
        before = (list(episode.response_ids), len(episode.images))
        closed = edits.edit(episode)
        if closed:  # the closed row is the row as it stood: what the engine was given
            segment = episode.segments[-1]
            assert list(segment.response_ids) == before[0] and len(segment.images) == before[1]
            # the new row's context holds every sampled token so far, verbatim, with its turn
            assert episode.context_length == len(episode.response_ids)
            assert sampled_with_turns(episode.response_ids, episode.loss_mask, episode.turn_ids) == written
        else:
            assert episode.response_ids == before[0]  # nothing to change: no segment, no edit
        episode.append_sampled(ids)
        written += [(t, episode.turns) for t in ids]
        pages = [FakePage(n) for n in sizes]
        observation = BUILDER.pages(pages, [f"doc_{step}{k}" for k in range(len(pages))], episode.remaining,
                                    episode.image_slots)
        if observation is None or not episode.append_observation(observation):
            break
    return written


@settings(max_examples=150, deadline=None)
@given(turns, policies)
def test_edits_keep_what_the_policy_wrote_and_the_two_views_in_step(script, policy):
    episode = Episode(0, [1, 2], [], "doc", response_length=4000, max_images=40)
    edits = editor(policy)
    written = run(episode, edits, script)
    rows = [*episode.segments, episode]
    # the last row holds the whole episode's sampled tokens
    assert sampled_with_turns(episode.response_ids, episode.loss_mask, episode.turn_ids) == written
    for row in rows:
        lengths = {len(row.response_ids), len(row.loss_mask), len(row.logprobs), len(row.turn_ids)}
        assert len(lengths) == 1
        assert [n for n in pad_runs(list(row.response_ids))] == [page.num_tokens for page in row.images]
        assert len(row.image_page_ids) == len(row.images) == len(row.image_regions)
    assert collapse_pad_runs(episode.response_ids) == episode.engine_response_ids
    assert episode.engine_response_ids.count(VS) == len(episode.images)
    # before the next turn, what stays full-size is what the policy keeps (or a page whose
    # thumbnail would be the page itself)
    if not episode.done:
        edits.edit(episode)
    shrinks = [form == "full" and not (policy.form == THUMBNAIL and page.num_tokens == 1)
               for form, page in zip(episode.image_forms, episode.images)]
    if policy.keep_turns:
        assert all(turn > episode.turns - policy.keep_turns - policy.slack
                   for turn, shrink in zip(episode.image_turns, shrinks) if shrink)
    if policy.keep_pages:
        assert sum(shrinks[: max(len(shrinks) - policy.keep_pages - policy.slack, 0)]) == 0
    assert len(episode.segments) == edits.edits


@settings(max_examples=60, deadline=None)
@given(turns)
def test_without_a_policy_nothing_changes(script):
    plain, edited = (Episode(0, [1, 2], [], "doc", response_length=4000, max_images=40) for _ in range(2))
    run(plain, editor(ContextPolicy()), script)
    assert plain.segments == [] and plain.context_length == 0


def test_a_stub_names_the_page_and_the_turn():
    episode = Episode(0, [1], [], "annual_report", response_length=2000, max_images=10)
    edits = editor(ContextPolicy(keep_turns=1))
    for turn in range(3):
        episode.append_sampled([65 + turn])
        observation = BUILDER.pages([FakePage(8)], [f"annual_report_{turn + 3}"], episode.remaining, 10)
        episode.append_observation(observation)
        edits.edit(episode)
    text = bytes(t for t in episode.response_ids if t < 256).decode()
    assert stub_text("annual_report_3", 1) in text and "[annual_report p.3, seen in turn 1]" in text
    assert "[annual_report p.4, seen in turn 2]" in text
    assert episode.image_page_ids == ["annual_report_5"]  # the last turn's page stays an image
    assert len(episode.segments) == 2


def test_the_commands_take_the_context_budget_flags():
    import pytest

    from vrag_rollout.cli import build_parser
    from vrag_rollout.devkit.context_flags import context_settings
    from vrag_rollout.devkit.job_checks import JobInputError

    parser = build_parser()
    for command in (["demo"], ["rollout", "--data", "q.parquet"], ["learn"], ["evaluate"]):
        args = parser.parse_args([*command, "--context-keep-turns", "2", "--context-edit-form", "thumbnail",
                                  "--visual-token-budget", "900", "--search-page-max-pixels", "50000",
                                  "--context-edit-slack", "1"])
        assert context_settings(args) == {"context_keep_turns": 2, "context_edit_form": "thumbnail",
                                           "visual_token_budget": 900, "search_page_max_pixels": 50000,
                                           "context_edit_slack": 1}
        assert context_settings(parser.parse_args(command)) == {}  # off unless asked
    with pytest.raises(JobInputError, match="--context-keep-pages must be at least 0"):
        context_settings(parser.parse_args(["demo", "--context-keep-pages", "-3"]))


def test_a_slack_edits_less_often_and_back_down_to_the_limit():
    """keep 1 turn with slack 2: nothing is edited until an image is 2 turns past the limit, then
    every image older than the last turn goes at once: one edit where slack 0 makes four."""
    rows = {}
    for slack in (0, 2):
        episode = Episode(0, [1], [], "doc", response_length=4000, max_images=40)
        edits = editor(ContextPolicy(keep_turns=1, slack=slack))
        for turn in range(1, 6):
            edits.edit(episode)
            episode.append_sampled([65 + turn])
            episode.append_observation(BUILDER.pages([FakePage(4)], [f"doc_{turn}"], episode.remaining, 40))
        edits.edit(episode)
        rows[slack] = (len(episode.segments) + 1, episode.image_page_ids)
    # slack 0: an edit before every turn from the third on; slack 2: one, before turn 5, back down
    # to the last turn's page (doc_4 came after it and is within the slack)
    assert rows == {0: (5, ["doc_5"]), 2: (2, ["doc_4", "doc_5"])}


def test_the_batch_metrics_count_every_image_shown_and_the_edits():
    from vrag_rollout.core.batch import collect_metrics

    episode = Episode(0, [1], [], "doc", response_length=2000, max_images=10)
    edits = editor(ContextPolicy(keep_pages=1))
    for turn in range(3):
        edits.edit(episode)
        episode.append_sampled([65 + turn])
        episode.append_observation(BUILDER.pages([FakePage(4), FakePage(6)], [f"doc_{turn}1", f"doc_{turn}2"],
                                                 episode.remaining, 10))
    metrics = collect_metrics([episode], {}, 1.0)
    assert metrics["rollout/images_retrieved"] == 6 and metrics["rollout/visual_tokens_mean"] == 30
    assert metrics["rollout/context_edits"] == 2 and metrics["rollout/rows"] == 3
    assert "rollout/rows" not in collect_metrics([Episode(1, [1], [], "doc", 10, 1)], {}, 1.0)


def test_a_thumbnail_is_never_larger_and_a_crop_reads_the_thumbnail():
    """A page already smaller than a thumbnail (shown under a visual budget) stays as it is and
    counts as a thumbnail, so it neither grows the row nor keeps a slack's trigger firing; a page
    made a thumbnail is what a later region action's box is read against."""
    episode = Episode(0, [1], [], "doc", response_length=4000, max_images=40)
    grow = ContextEditor(ContextPolicy(keep_turns=1, form=THUMBNAIL, slack=1), VS, VE, PAD,
                         encode=BUILDER.encode_text, thumbnail=lambda page: FakePage(page.num_tokens * 3))
    episode.append_sampled([65])
    episode.append_observation(BUILDER.pages([FakePage(4)], ["doc_1"], episode.remaining, 40))
    for turn in range(3):
        episode.append_sampled([66 + turn])
        episode.append_observation(BUILDER.pages([FakePage(4)], [f"doc_{turn + 2}"], episode.remaining, 40))
        before = list(episode.response_ids)
        assert not grow.edit(episode) and episode.response_ids == before  # never larger: nothing changes
    assert episode.image_forms[:2] == [THUMBNAIL, THUMBNAIL] and episode.segments == []

    episode = Episode(0, [1], [], "doc", response_length=4000, max_images=40)
    shrink = editor(ContextPolicy(keep_turns=1, form=THUMBNAIL))
    episode.append_sampled([65])
    episode.append_observation(BUILDER.pages([FakePage(16)], ["doc_1"], episode.remaining, 40))
    episode.append_sampled([66])
    episode.append_observation(BUILDER.pages([FakePage(16)], ["doc_2"], episode.remaining, 40))
    assert shrink.edit(episode)
    assert episode.shown_pages["doc_1"] is episode.images[0] and episode.images[0].num_tokens == 4
    assert episode.shown_pages["doc_2"].num_tokens == 16
