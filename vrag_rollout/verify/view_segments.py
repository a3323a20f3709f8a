"""The view of a segmented batch (context edits): an episode's rows grouped side by side, with what
each edit changed (an image made a text stub or a thumbnail), read from the saved tokens alone.

`segment_changes(before, after)` walks an earlier row's whole response beside the next row's
context; `_segment_group` renders an episode's rows (the view's `_Episode` objects, rendered by
`view.py`), found by `check.segments.episodes_of` (`episode_id`).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Any, Optional

from .view_html import IMAGE_PAD, VISION_END, VISION_START, _count, data_uri

# Only on segmented batches (context edits), so other pages render as before.
_SEGMENT_CSS = """
.segmented{border:2px solid #8a6ad6;border-radius:8px;padding:.6em;margin:1em 0;background:#f6f3fc}
.seg-rows{display:flex;gap:.8em;overflow-x:auto;align-items:flex-start}
.seg-rows>section.episode{flex:0 0 46em;max-width:46em;margin:.4em 0}
.seg-note{font-size:.8em;font-weight:normal;color:#6a4bb6}
.seg-changes{margin:.2em 0 .4em;font-size:.88em}.seg-change.other{color:#b00020}
img.was,img.now{max-height:48px;max-width:60px;border:1px solid #888;vertical-align:middle;cursor:zoom-in}
code.stub{background:#fff4d6}
.ctx{opacity:.55}.ctx-end{display:inline-block;font-family:system-ui,sans-serif;font-size:.72em;background:#8a6ad6;
  color:#fff;padding:0 4px;margin:0 4px;border-radius:3px}
.b-ctx{background:#b9a7e6}
"""


# ---- segmented batches (context edits): an episode's rows, grouped, with what each edit changed ----

STUB_TEXT = re.compile(r"\[[^\[\]]*, seen in turn \d+\]")  # core.context_edit.stub_text, restated


@dataclass
class SegmentChange:
    """One image of a row that the next row's context shows otherwise."""

    kind: str  # "stub", "thumbnail", or "other" (the context differs there in another way: see `check`)
    image: int  # its number in the earlier row (prompt images first)
    page_id: str  # as that row's view captions it
    tokens: int  # its image tokens in the earlier row
    new_tokens: int = 0  # the thumbnail's image tokens, or the stub's tokens
    new_image: Optional[int] = None  # the thumbnail's number in the later row
    text: str = ""  # the stub's text


def segment_changes(before: Any, after: Any) -> list[SegmentChange]:
    """What the edit between two consecutive rows of an episode changed: `before`'s whole response
    walked beside `after`'s context (the tokens before its own turns). Sampled text and unchanged
    observation text are equal token for token; an image block is kept (same size), became a
    thumbnail (another size) or a text stub; anything else ends the walk with one "other" change
    (a broken edit: `check` names it)."""
    start, pad, end = (before.vision[name] for name in (VISION_START, IMAGE_PAD, VISION_END))
    old, new = before.response_ids, after.response_ids[: after.context]
    old_image, new_image = before.prompt_images, after.prompt_images
    changes: list[SegmentChange] = []

    def block(ids: list[int], i: int) -> int:  # end of the image block starting at i (past its vision_end)
        j = i + 1
        while j < len(ids) and ids[j] == pad:
            j += 1
        return j + 1 if j < len(ids) and ids[j] == end else j

    i = j = 0
    while i < len(old) and j < len(new):
        if old[i] == start:
            i_end = block(old, i)
            tokens = i_end - i - 2
            page = before.captions.get(old_image, "")
            if new[j] == start:
                j_end = block(new, j)
                if j_end - j != i_end - i:
                    changes.append(SegmentChange("thumbnail", old_image, page, tokens, j_end - j - 2, new_image))
                new_image += 1
            else:
                j_end = next((k for k in range(j + 1, len(new) + 1) if STUB_TEXT.fullmatch(after.decode(new[j:k]))),
                             None)
                if j_end is None:
                    return changes + [SegmentChange("other", old_image, page, tokens)]
                changes.append(SegmentChange("stub", old_image, page, tokens, j_end - j, None,
                                             after.decode(new[j:j_end])))
            old_image += 1
            i, j = i_end, j_end
        elif old[i] == new[j]:
            i, j = i + 1, j + 1
        else:
            return changes + [SegmentChange("other", old_image, "", 0)]
    if i < len(old) or j < len(new):  # one ran out first: the context is not the earlier row, edited
        changes.append(SegmentChange("other", old_image, "", 0))
    return changes


def _changes_html(before: Any, after: Any) -> str:
    """One list item per change: the earlier image, an arrow, what the later row's context holds."""
    items = []
    for change in segment_changes(before, after):
        if change.kind == "other":
            items.append('<li class="seg-change other">the context differs from the previous row in another way '
                         "(not an image made a stub or a thumbnail): see <code>vrag-rollout check</code></li>")
            continue
        was = html.escape(f"image {change.image}: {change.page_id} · {_count(change.tokens, 'token')}")
        old = (f'<img class="was" alt="{was}" title="{was}" src="{data_uri(before.images[change.image])}" '
               'onclick="enlarge(this)">' if change.image < len(before.images) else "")
        if change.kind == "stub":
            now = f'stub <code class="stub">{html.escape(change.text)}</code> ({_count(change.new_tokens, "token")})'
        else:
            label = html.escape(f"image {change.new_image} of row {after.row}: thumbnail, "
                                f"{_count(change.new_tokens, 'token')}")
            now = (f'<img class="now" alt="{label}" title="{label}" src="{data_uri(after.images[change.new_image])}" '
                   f'onclick="enlarge(this)"> thumbnail, {_count(change.new_tokens, "token")}'
                   if change.new_image is not None and change.new_image < len(after.images) else label)
        items.append(f'<li class="seg-change {change.kind}">{old} {was} &rarr; {now}</li>')
    if not items:
        items.append('<li class="seg-change none">no image changed</li>')
    return "".join(items)


def _visual_tokens(ep: Any) -> int:
    return sum(1 for token in ep.prompt_ids + ep.response_ids if token == ep.vision[IMAGE_PAD])


def _segment_group(episode: int, rows: list[Any], sections: list[str]) -> str:
    """An episode cut by context edits: a line per row (its turns, context, visual tokens) and what
    each edit changed, then its rows side by side."""
    lines = []
    for k, ep in enumerate(rows):
        turns = int(ep.saved.column("num_turns", 0)[ep.row] or 0)
        head = (f'<a href="#ep-{ep.row}">row {ep.row}</a>: {_count(turns, "turn")} so far, context '
                f'{_count(ep.context, "token")} (out of its loss), {_visual_tokens(ep)} visual tokens, '
                f'ends {html.escape(str(ep.reason))}')
        changed = "" if k == 0 else f'<ul class="seg-changes">{_changes_html(rows[k - 1], ep)}</ul>'
        edit = "" if k == 0 else f" · edit before it, from row {rows[k - 1].row}:"
        lines.append(f"<li>{head}{edit}{changed}</li>")
    return (f'<div class="segmented" id="episode-{episode}"><h2>episode {episode}: {_count(len(rows), "row")} '
            f'(context edits)</h2><ol class="seg-rows-list">{"".join(lines)}</ol>'
            f'<div class="seg-rows">{"".join(sections)}</div></div>')
