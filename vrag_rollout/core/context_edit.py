"""Context edits between turns, and the segments they cut an episode into (pure).

A `ContextPolicy` decides, before each turn, which images of the episode's current row to
replace: those shown more than `keep_turns` turns ago, or beyond the last `keep_pages` images
(with a `slack`, only once the limit is passed by more than that, then back down to it).
A replaced image becomes a short text stub naming its page ("[report p.3, seen in turn 2]"; the
policy can `fetch` it again) or a thumbnail of it.

An edit that changes something closes a segment. The row as it stood (`Segment`: exactly what
the engine was given for the segment's turns, plus the observation answering the last of them)
is kept, and the episode goes on from the edited context. The next row's response part begins
with that context (`context_length` tokens, out of the loss) and then holds its own turns.

Invariants (checked by `verify/check/segments.py` and property tests):
- an edit changes no sampled token: a row's context holds every earlier turn's sampled tokens
  verbatim and in order, with each token's turn id;
- the engine and trainer views change together: an image's block (`<|vision_start|>`, its pad
  or pad run, `<|vision_end|>`) is replaced by the stub's tokens in both, or keeps its one pad
  and gets the thumbnail's pad run; the row's image list follows;
- an edit that would change nothing closes no segment (rows whose prefix did not change merge);
- without a policy nothing here runs, and an episode is one row as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

STUB = "stub"
THUMBNAIL = "thumbnail"


@dataclass(frozen=True)
class ContextPolicy:
    keep_turns: int = 0  # images of the last this many turns stay (0: no turn limit)
    keep_pages: int = 0  # the last this many images stay (0: no count limit)
    form: str = STUB  # what an older image becomes: STUB or THUMBNAIL
    # Edit only once the limit is passed by more than this many turns (or pages), then back down
    # to the limit: fewer edits, so fewer rows, for a longer longest row (0: edit every turn).
    slack: int = 0

    @property
    def active(self) -> bool:
        return self.keep_turns > 0 or self.keep_pages > 0

    def images_to_replace(self, image_turns: Sequence[int], forms: Sequence[str], turns_done: int) -> list[int]:
        """Indices (row order) of the images this policy replaces before turn `turns_done + 1`."""
        live = [k for k in range(len(image_turns)) if forms[k] != self.form]
        due = set()
        if self.keep_turns and any(image_turns[k] <= turns_done - self.keep_turns - self.slack for k in live):
            due |= {k for k in live if image_turns[k] <= turns_done - self.keep_turns}
        if self.keep_pages and len(live) > self.keep_pages + self.slack:
            due |= set(live[: len(live) - self.keep_pages])
        return sorted(due)


@dataclass(frozen=True)
class Segment:
    """One closed row of an episode: its response part as the engine saw it (context first)."""

    response_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]  # 1 = sampled by the policy (the context's sampled tokens too)
    logprobs: tuple[float, ...]
    turn_ids: tuple[int, ...]
    images: tuple[Any, ...]
    image_regions: tuple[Optional[list[float]], ...]
    image_page_ids: tuple[str, ...]
    page_ids: tuple[tuple[str, ...], ...]  # per observation so far (the whole episode's)
    observation_turns: tuple[int, ...]
    context_length: int  # response tokens before this row's own turns
    turns: int  # turns done when it closed

    def turn_page_ids(self) -> list[list[str]]:
        pages: list[list[str]] = [[] for _ in range(self.turns)]
        for turn, shown in zip(self.observation_turns, self.page_ids):
            pages[turn - 1].extend(shown)
        return pages


def stub_text(page_id: str, turn: int, region: bool = False) -> str:
    """The text an edited-out image leaves: which page, when; `page_id` is "<doc>_<page>"."""
    doc, _, page = page_id.rpartition("_")
    name = f"{doc} p.{page}" if doc and page.isdigit() else page_id
    return f"[{name}{' region' if region else ''}, seen in turn {turn}]"


@dataclass
class ContextEditor:
    """Applies a policy to an episode; `encode(text) -> ids` tokenizes stubs, `thumbnail(page)`
    returns a page's thumbnail (a `vision.PageImage`)."""

    policy: ContextPolicy
    vision_start: int
    vision_end: int
    image_pad: int
    encode: Callable[[str], list[int]]
    thumbnail: Optional[Callable[[Any], Any]] = None
    edits: int = field(default=0)

    def edit(self, episode: Any) -> bool:
        """Edit `episode`'s context before its next turn; True when a segment closed."""
        if not self.policy.active or episode.done:
            return False
        chosen = self.policy.images_to_replace(episode.image_turns, episode.image_forms, episode.turns)
        replacements = {k: self._replacement(episode, k) for k in chosen}
        for k, replacement in replacements.items():
            if replacement is None:  # already as small as a thumbnail: it counts as one (no token changes)
                episode.image_forms[k] = THUMBNAIL
        replacements = {k: r for k, r in replacements.items() if r is not None}
        if not replacements:
            return False
        episode.segments.append(snapshot(episode))
        for k in sorted(replacements, reverse=True):  # back to front: earlier spans stay put
            _replace(episode, k, replacements[k], self)
        episode.context_length = len(episode.response_ids)
        self.edits += 1
        return True

    def _replacement(self, episode: Any, k: int) -> Optional[tuple]:
        """("stub", ids) or ("thumbnail", page); None when the thumbnail would not be smaller (a
        page shown small already, e.g. under a visual budget: a thumbnail band may be larger)."""
        if self.policy.form == STUB:
            region = episode.image_regions[k] is not None
            ids = self.encode(stub_text(episode.image_page_ids[k], episode.image_turns[k], region))
            return STUB, list(ids)
        if self.thumbnail is None:
            raise RuntimeError("a thumbnail context edit needs a thumbnail maker")
        small = self.thumbnail(episode.images[k])
        return None if small.num_tokens >= episode.images[k].num_tokens else (THUMBNAIL, small)


def snapshot(episode: Any) -> Segment:
    return Segment(
        response_ids=tuple(episode.response_ids), loss_mask=tuple(episode.loss_mask),
        logprobs=tuple(episode.logprobs), turn_ids=tuple(episode.turn_ids), images=tuple(episode.images),
        image_regions=tuple(episode.image_regions), image_page_ids=tuple(episode.image_page_ids),
        page_ids=tuple(tuple(p) for p in episode.page_ids), observation_turns=tuple(episode.observation_turns),
        context_length=episode.context_length, turns=episode.turns)


def image_starts(ids: Sequence[int], vision_start: int) -> list[int]:
    """Where each image block of a response begins (sampled text never holds the vision tokens:
    they are banned from sampling, and page text encodes them as plain text)."""
    return [i for i, token in enumerate(ids) if token == vision_start]


def _replace(episode: Any, k: int, replacement: tuple, editor: ContextEditor) -> None:
    kind, value = replacement
    trainer_start = image_starts(episode.response_ids, editor.vision_start)[k]
    engine_start = image_starts(episode.engine_response_ids, editor.vision_start)[k]
    trainer_end = trainer_start + episode.images[k].num_tokens + 2
    turn = episode.turn_ids[trainer_start]
    if kind == STUB:
        new_trainer = new_engine = list(value)
        engine_end = engine_start + 3
    else:
        new_trainer = [editor.vision_start] + [editor.image_pad] * value.num_tokens + [editor.vision_end]
        new_engine = episode.engine_response_ids[engine_start:engine_start + 3]
        engine_end = engine_start + 3
    if episode.response_ids[trainer_end - 1] != editor.vision_end:
        raise AssertionError(f"episode {episode.index}: image {k}'s block does not end where its grid says")
    size = len(new_trainer)
    episode.response_ids[trainer_start:trainer_end] = new_trainer
    episode.loss_mask[trainer_start:trainer_end] = [0] * size
    episode.logprobs[trainer_start:trainer_end] = [0.0] * size
    episode.turn_ids[trainer_start:trainer_end] = [turn] * size
    episode.engine_response_ids[engine_start:engine_end] = new_engine
    if kind == STUB:
        for column in (episode.images, episode.image_regions, episode.image_page_ids, episode.image_turns,
                       episode.image_forms):
            del column[k]
    else:
        page_id = episode.image_page_ids[k]
        if episode.image_regions[k] is None and episode.shown_pages.get(page_id) is episode.images[k]:
            # a region action reads its box against the page as the context now shows it
            episode.shown_pages[page_id] = value
        episode.images[k] = value
        episode.image_forms[k] = THUMBNAIL


__all__ = ["ContextEditor", "ContextPolicy", "STUB", "Segment", "THUMBNAIL", "image_starts", "snapshot", "stub_text"]
