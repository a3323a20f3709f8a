"""`vrag-rollout view`: a saved rollout batch as one self-contained, static HTML page.

`write_html(path, out_html, model_dir=None, truths=None) -> Path` reads a saved batch (or a
pickled trainer DataProto, see saved_batch.py) and writes a page that needs no server and no
network: images are embedded as data URIs, the little CSS and JavaScript are inline. The page
leads with the episodes (its first screen shows them, not the batch's numbers):

- a table of the episodes (`<tr class="ep-row" data-reason=...>`), one row each: its number (a
  link to its section), question, doc id, termination reason (a `budget` end says which turn's
  result did not fit), turns, the pages it was shown (gold pages marked), and, when the batch
  has them, the ground truth and the reward (`episode_facts` says where each comes from);
- a filter by termination reason (also set by the link: `report.html#reason=answered`);
- the batch (model family, action grammar, the rollout config's main settings, the metrics
  table) in a collapsed `<details class="batch">`;
- one section per episode (`<section class="episode" id="ep-ROW" data-reason=...>`): its
  question, ground truth and reward (overall and parts), then the conversation as the model saw
  it (the prompt, collapsed, then the response), sampled text (loss mask 1) and observation
  blocks (loss mask 0) styled apart, every image as a thumbnail where its image tokens sit
  (`<img class="thumb" id="img-ROW-K">`; click to enlarge, or open the link
  `report.html#image=ROW-K`; gold pages framed; a crop, per the batch's `image_regions`, beside
  an unnumbered copy of its source page, the episode's latest earlier image of that page id, with
  the box drawn: `<figure class="crop">`), the page ids of each observation,
  turns/searches/fetches, and a bar of the response budget: sampled, observation and unused
  tokens.

A segmented batch (context edits: an `episode_id` column, rows of one episode adjacent) shows each
episode cut into rows as one `<div class="segmented" id="episode-E">`: a line per row (turns so
far, its context's length, its visual tokens, its ending) with what the edit before it changed,
read from the tokens alone (`segment_changes`: each image of the earlier row that the later row's
context holds as a text stub or as a thumbnail, old and new side by side; a context that differs
otherwise is flagged), then its rows side by side, each row's context (out of its loss) dimmed
before a "this row's own turns" mark. A batch without that column renders as before.

Rewards are shown when the batch carries them, never computed: `verify/` does not import the
reward (`core.reward`) it would display. `truths` ({question: ground truth}, see
`episode_facts.load_truths`) supplies ground truths a batch lacks, matched by question: a file
holding none of the batch's questions is refused (`TruthsMatchNothing`, nothing written), one
lacking some is warned about on stderr (`check_truths_match`). Text is decoded with the
batch's own token texts (saved by `save_rollout`) or, when given or when the batch has none,
with the tokenizer of `model_dir`. All text is HTML-escaped.
"""

from __future__ import annotations

import html
import json
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from . import episode_facts as facts
from .saved_batch import SavedBatch, load_rollout
from .view_html import IMAGE_PAD, VISION_END, VISION_START, _count, data_uri
from .check.segments import episodes_of
from .view_segments import _SEGMENT_CSS, _segment_group
from .view_turns import turn_rewards_html


class ViewInputError(ValueError):
    """The batch cannot be viewed (no token texts and no tokenizer, not a batch)."""


class TruthsMatchNothing(ViewInputError):
    """No question of the batch is in the `--truths` file (a file of other questions)."""


def _decoder(saved: SavedBatch, model_dir: Optional[str]) -> tuple[Callable[[list[int]], str], dict[str, int]]:
    """(decode ids -> text, {vision token name: id}) from the tokenizer or the saved token texts."""
    if model_dir is None and not saved.token_text:
        if saved.model_path and Path(saved.model_path).is_dir():
            model_dir = saved.model_path
        else:
            raise ViewInputError("the batch carries no token texts (a trainer batch?): pass --model DIR to decode it")
    if model_dir is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        names = {name: tokenizer.convert_tokens_to_ids(name) for name in (IMAGE_PAD, VISION_START, VISION_END)}
        return (lambda ids: tokenizer.decode(ids, skip_special_tokens=False)), names
    texts = saved.token_text
    by_text = {text: token for token, text in texts.items()}
    names = {name: by_text.get(name, -1) for name in (IMAGE_PAD, VISION_START, VISION_END)}
    return (lambda ids: "".join(texts.get(token, f"<{token}>") for token in ids)), names


def _split_at(runs: list[tuple[int, int, int]], cut: int) -> list[tuple[int, int, int]]:
    """`runs` with the one that spans `cut` split there (a segment row's context ends at `cut`)."""
    out = []
    for value, start, end in runs:
        if start < cut < end:
            out += [(value, start, cut), (value, cut, end)]
        else:
            out.append((value, start, end))
    return out


def _runs(flags: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of a 0/1 list."""
    out, start = [], 0
    for i in range(1, len(flags) + 1):
        if i == len(flags) or flags[i] != flags[start]:
            out.append((flags[start], start, i))
            start = i
    return [run for run in out if run[2] > run[1]]


class _Episode:
    """One sample: its row of the episode table and its section. Images are numbered in sequence
    order across prompt and response."""

    def __init__(self, saved: SavedBatch, row: int, decode: Callable, vision: dict[str, int],
                 truths: Optional[dict] = None):
        t = saved.tensors
        self.saved, self.row, self.decode, self.vision = saved, row, decode, vision
        self.P = int(t["prompts"].shape[1])
        self.R = int(t["responses"].shape[1])
        attention = t["attention_mask"][row].tolist()
        self.prompt_ids = [tok for tok, a in zip(t["input_ids"][row, : self.P].tolist(), attention[: self.P]) if a]
        self.used = int(sum(attention[self.P:]))
        self.response_ids = t["responses"][row, : self.used].tolist()
        loss = t["loss_mask"] if "loss_mask" in t else t["response_mask"]
        self.loss = [int(x) for x in loss[row, : self.used].tolist()]
        # A segment row (context edits): its first `context` response tokens are the edited
        # context, out of its loss; `sampled_mask` still tells the policy's tokens there apart.
        self.context = int(saved.column("context_length", 0)[row] or 0)
        sampled = t["sampled_mask"] if "sampled_mask" in t else None
        self.sampled = self.loss if sampled is None else [int(x) for x in sampled[row, : self.used].tolist()]
        self.segment: Optional[tuple[int, int, int]] = None  # (episode id, index, rows): `_episodes`
        self.captions: dict[int, str] = {}  # image number -> its page id as rendered (`segment_changes`)
        self.images = saved.images[row]
        self.next_image = 0
        self.prompt_images = sum(1 for a, b in zip(self.prompt_ids, self.prompt_ids[1:])
                                 if a == vision[VISION_START] and b == vision[IMAGE_PAD])
        regions = saved.column("image_regions", None)[row]  # per retrieved image: None or a crop's box
        self.regions = [] if regions is None else list(regions)
        self.shown_pages: dict[str, int] = {}  # page id -> its latest whole-page image (a crop's source)
        self.crops = 0
        self.reason = saved.column("termination_reason")[row]
        self.doc_id = saved.column("doc_id")[row]
        self.page_ids = saved.column("page_ids", [])[row] or []
        self.runs = _split_at(_runs(self.sampled), self.context)
        self.sampled_texts = [decode(self.response_ids[start:end]) for value, start, end in self.runs if value]
        self.answer = facts.policy_answer("".join(self.sampled_texts))
        vision_ids = set(vision.values())
        self.question = facts.question(decode([tok for tok in self.prompt_ids if tok not in vision_ids]))
        self.truth = facts.ground_truth(saved, row, truths, self.question)
        self.reward = facts.reward(saved, row)

    def segment_note(self) -> str:
        """" · episode E, row k of N" for a row of an episode cut by context edits, else ""."""
        if self.segment is None or self.segment[2] < 2:
            return ""
        episode, index, count = self.segment
        return (f' <span class="seg-note">· <a href="#episode-{episode}">episode {episode}</a>, '
                f'row {index + 1} of {count}</span>')

    def _gold(self, page_id: str) -> bool:
        return facts.is_gold(page_id, self.truth, self.doc_id)

    def _page(self, page_id: Any) -> str:
        text = html.escape(str(page_id))
        return f'<mark class="gold" title="a gold page">{text} (gold)</mark>' if self._gold(str(page_id)) else text

    def pages_html(self) -> str:
        shown = [page for turn in self.page_ids for page in (turn or [])]
        return ", ".join(self._page(page) for page in shown) or "-"

    def end_note(self, brief: bool = False) -> str:
        """Why a `budget` episode ended (the turn and what it asked for); "" for other endings."""
        if self.reason != "budget":
            return ""
        return facts.budget_note(
            turn=int(self.saved.column("num_turns", 0)[self.row] or 0),
            last_sampled=self.sampled_texts[-1] if self.sampled_texts else "",
            last_is_observation=bool(self.runs) and not self.runs[-1][0], remaining=self.R - self.used, length=self.R,
            last_pages=self.page_ids[-1] if self.page_ids else (),
            overflow=self.saved.column("budget_overflow")[self.row], brief=brief,
        )

    def reward_html(self, brief: bool = False) -> str:
        """Overall and its parts; `brief` (the table): the parts only as the cell's tooltip."""
        if self.reward is None:
            return ""
        parts = " · ".join(f"{name} {self.reward[name]:.2f}" for name in facts.REWARD_PARTS if name in self.reward)
        overall = f'{self.reward["overall"]:.2f}'
        if brief:
            return f'<span title="{html.escape(parts)}">{overall}</span>' if parts else overall
        return overall + (f' <span class="parts">({parts})</span>' if parts else "")

    def truth_html(self) -> str:
        """The answer, then the gold pages as page ids (`<doc>_<page>`, as the shown pages are)."""
        if self.truth is None:
            return ""
        doc = self.truth.doc_id
        gold = ", ".join(f"{page[0]}_{page[1]}" if isinstance(page, tuple) else f"{doc}_{page}" if doc else str(page)
                         for page in self.truth.gold_pages)
        return html.escape(self.truth.answer) + (f' <span class="parts">(gold: {html.escape(gold)})</span>'
                                                  if gold else "")

    def index_row(self, with_truth: bool, with_reward: bool) -> str:
        """The episode's row in the table the page opens on."""
        note = self.end_note(brief=True)
        end = html.escape(str(self.reason)) + (f'<div class="note">{html.escape(note)}</div>' if note else "")
        cells = [f'<td><a href="#ep-{self.row}">{self.row}</a>{self.segment_note()}</td>',
                 f'<td class="question">{html.escape(self.question)}</td>',
                 f'<td class="answer">{html.escape(self.answer if self.answer is not None else "-")}</td>']
        if with_truth:
            cells.append(f'<td class="truth">{self.truth_html() or "-"}</td>')
        if with_reward:
            cells.append(f'<td class="reward">{self.reward_html(brief=True) or "-"}</td>')
        cells += [f"<td>{html.escape(str(self.doc_id))}</td>", f'<td class="end">{end}</td>',
                  f'<td>{html.escape(str(self.saved.column("num_turns")[self.row]))}</td>',
                  f"<td>{self.pages_html()}</td>"]
        return f'<tr class="ep-row" data-reason="{html.escape(str(self.reason))}">{"".join(cells)}</tr>'

    def _image(self, page_id: str, tokens: int) -> str:
        k = self.next_image
        self.next_image += 1
        if k >= len(self.images):
            return f'<span class="missing">[image {k}: {_count(tokens, "image token")}, no saved image]</span>'
        gold = self._gold(page_id)
        j = k - self.prompt_images  # regions are indexed by retrieved image, the prompt's come first
        region = self.regions[j] if 0 <= j < len(self.regions) else None
        if region is not None:
            return self._crop(k, page_id, tokens, [float(v) for v in region], gold)
        if j >= 0 and page_id:
            self.shown_pages[page_id] = k
        self.captions[k] = page_id
        label = html.escape(f"image {k}: {page_id + ' · ' if page_id else ''}{'gold page · ' if gold else ''}"
                            f"{_count(tokens, 'token')}")
        return (f'<figure class="page{" gold" if gold else ""}"><img class="thumb" id="img-{self.row}-{k}" '
                f'alt="{label}" title="{label}" src="{data_uri(self.images[k])}"><figcaption>{label}</figcaption>'
                "</figure>")

    def _crop(self, k: int, page_id: str, tokens: int, box: list[float], gold: bool) -> str:
        """Crop image k beside a copy of its source page (no `img-` id: not an image of the sequence)
        with the box drawn over it in percentages, so it scales with the thumbnail."""
        self.crops += 1
        label = html.escape(f"image {k}: region of {page_id} {[round(v, 3) for v in box]} · "
                            f"{'gold page · ' if gold else ''}{_count(tokens, 'token')}")
        crop = (f'<img class="thumb" id="img-{self.row}-{k}" alt="{label}" title="{label}" '
                f'src="{data_uri(self.images[k])}">')
        source = self.shown_pages.get(page_id)
        if source is None:
            beside = '<span class="crop-note">source page not in this episode</span>'
        else:
            x1, y1, x2, y2 = box
            style = (f"left:{100 * x1:.1f}%;top:{100 * y1:.1f}%;"
                     f"width:{100 * (x2 - x1):.1f}%;height:{100 * (y2 - y1):.1f}%")
            what = html.escape(f"image {source}: {page_id}, the page the region was cut from")
            beside = (f'<span class="crop-frame"><img class="crop-source" alt="{what}" title="{what}" '
                      f'src="{data_uri(self.images[source])}" onclick="enlarge(this)">'
                      f'<span class="crop-box" style="{style}"></span></span>')
        return (f'<figure class="crop{" gold" if gold else ""}">{crop}{beside}<figcaption>{label}</figcaption>'
                "</figure>")

    def _text_with_images(self, ids: list[int], captions: list[str]) -> str:
        """Escaped text of `ids` with each vision block replaced by its thumbnail."""
        out, text, i = [], [], 0
        pad, start, end = self.vision[IMAGE_PAD], self.vision[VISION_START], self.vision[VISION_END]
        captions = list(captions)
        while i < len(ids):
            if ids[i] == start and i + 1 < len(ids) and ids[i + 1] == pad:
                j = i + 1
                while j < len(ids) and ids[j] == pad:
                    j += 1
                out.append(html.escape(self.decode(text)))
                text = []
                out.append(self._image(captions.pop(0) if captions else "", j - i - 1))
                i = j + 1 if j < len(ids) and ids[j] == end else j
                continue
            text.append(ids[i])
            i += 1
        out.append(html.escape(self.decode(text)))
        return "".join(out)

    def _response(self) -> str:
        parts, observation = [], 0
        for value, start, end in self.runs:
            ids = self.response_ids[start:end]
            if self.context and start == self.context:
                parts.append('<span class="ctx-end" title="the row\'s own turns (in its loss) begin here">'
                             'this row\'s own turns</span>')
            context = ' ctx" title="context: out of this row\'s loss' if start < self.context else ""
            if value:
                text = self._text_with_images(ids, [])
                parts.append(f'<span class="sampled{context}" data-pos="{self.P + start}">{text}</span>')
                continue
            pages = self.page_ids[observation] if observation < len(self.page_ids) else []
            observation += 1
            tag = (f'<span class="obs-tag">pages: {", ".join(self._page(p) for p in pages)}</span>' if pages
                   else '<span class="obs-tag">observation</span>')
            # `pages` is every page shown, in render order, text pages too: an image's caption is
            # the next page not shown as text ("page <id>:")
            shown_as_text = self.decode(ids)
            captions = [str(p) for p in pages if f"page {p}:" not in shown_as_text]
            parts.append(f'<span class="obs{context}" data-pos="{self.P + start}">{tag}'
                         f'{self._text_with_images(ids, captions)}</span>')
        if self.next_image < len(self.images):  # a broken batch: show what no image tokens point at
            extra = "".join(self._image("no image tokens", 0) for _ in range(len(self.images) - self.next_image))
            parts.append(f'<div class="missing">saved images without image tokens: {extra}</div>')
        return "".join(parts)

    def _budget_bar(self) -> str:
        sampled = sum(self.loss)
        observed = self.used - sampled - self.context
        unused = self.R - self.used
        # a segment row's context (its edited earlier turns, out of its loss) comes first
        shares = ((("b-ctx", "context", self.context),) if self.context else ()) + (
            ("b-sampled", "sampled", sampled), ("b-obs", "observation", observed), ("b-unused", "unused", unused))
        bar = "".join(
            f'<span class="{cls}" style="width:{100 * count / max(self.R, 1):.3f}%" title="{label}: {count}"></span>'
            for cls, label, count in shares
        )
        context = f'<span class="k b-ctx"></span>context {self.context} ' if self.context else ""
        return (f'<div class="budget"><div class="bar" role="img" aria-label="response budget">{bar}</div>'
                f'<div class="legend">{context}<span class="k b-sampled"></span>sampled {sampled} '
                f'<span class="k b-obs"></span>'
                f'observation {observed} <span class="k b-unused"></span>unused {unused} of {self.R}</div></div>')

    def _head(self) -> str:
        """Question, ground truth, reward and a budget end's cause, above the conversation."""
        answer = self.answer if self.answer is not None else "none"
        lines = [f'<p class="question"><b>question</b> {html.escape(self.question)}</p>',
                 f'<p class="answer"><b>answer</b> {html.escape(answer)}</p>']
        if self.truth is not None:
            lines.append(f'<p class="truth"><b>ground truth</b> {self.truth_html()}</p>')
        if self.reward is not None:
            lines.append(f'<p class="reward"><b>reward</b> {self.reward_html()}</p>')
            per_turn = turn_rewards_html(self.saved.column("turn_page_ids", None)[self.row], self.reward, self.truth,
                                         self.doc_id)
            if per_turn:
                lines.append(f'<p class="reward turns"><b>per turn</b> {per_turn}</p>')
        elif self.truth is not None:
            lines.append('<p class="reward"><b>reward</b> not in the batch</p>')
        note = self.end_note()
        if note:
            lines.append(f'<p class="note"><b>budget</b> {html.escape(note)}</p>')
        for failure in self.saved.column("guard_failures", None)[self.row] or ():  # saved by the live guard
            lines.append(f'<p class="guard"><b>guard</b> {html.escape(str(failure))}</p>')
        return "".join(lines)

    def render(self) -> str:
        saved, row = self.saved, self.row
        prompt = self._text_with_images(self.prompt_ids, ["prompt"] * self.prompt_images)
        response = self._response()
        counters = [(name, saved.column(f"num_{name}")[row]) for name in ("turns", "searches", "fetches")]
        if saved.column("num_crops", 0)[row]:  # only where the region action was used
            counters.append(("crops", saved.column("num_crops")[row]))
        facts_html = _facts([("doc", self.doc_id), ("end", self.reason), *counters, ("images", len(self.images))])
        facts_html += f' <span class="fact"><b>pages</b> {self.pages_html()}</span>'
        return (
            f'<section class="episode" id="ep-{row}" data-reason="{html.escape(str(self.reason))}">'
            f'<h2>{"row" if self.segment_note() else "episode"} {row}{self.segment_note()}</h2>{self._head()}<div class="facts">{facts_html}</div>{self._budget_bar()}'
            f'<details class="prompt"><summary>prompt ({_count(len(self.prompt_ids), "token")}, '
            f'{_count(self.prompt_images, "image")})'
            '</summary>'
            f'<div class="conv">{prompt}</div></details>'
            f'<div class="conv response">{response}</div></section>'
        )


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.2em 1.5em;background:#fafafa;color:#222}
h1{font-size:1.3em;margin:.2em 0}h2{font-size:1.1em;margin:.2em 0}
.lead{margin:.3em 0 .6em}
table.episodes{border-collapse:collapse;font-size:.88em;background:#fff;width:100%}
table.episodes caption{text-align:left;font-weight:bold;padding:.2em 0}
table.episodes th,table.episodes td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
table.episodes th{background:#eee}
table.episodes td.question{min-width:18em;max-width:36em}table.episodes td.end{max-width:24em}
.note{font-size:.85em;color:#8a4b00}
.guard{color:#b00020}
mark.gold{background:#ffe08a;color:#222}
figure.page.gold img{border:3px solid #d9a400}
.parts{color:#555;font-size:.9em}
details.batch{margin:.8em 0}details.batch summary,.prompt summary{cursor:pointer;color:#444}
table.metrics{border-collapse:collapse;font-size:.85em}table.metrics td{border:1px solid #ddd;padding:2px 8px}
.episode{background:#fff;border:1px solid #ccc;border-radius:6px;padding:.8em;margin:1em 0}
.episode p{margin:.25em 0}.question{font-size:1.02em}
.fact{display:inline-block;margin-right:1em;font-size:.9em}
.conv{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:.82em;line-height:1.5}
.sampled{background:#e3f4e1;border-bottom:2px solid #4caf50}
.obs{background:#e8eefb;border:1px dashed #5b7fd6;display:inline;color:#333}
.obs-tag{font-family:system-ui,sans-serif;font-size:.75em;background:#5b7fd6;color:#fff;padding:0 4px;
  margin-right:4px;border-radius:3px}
.obs-tag mark.gold{padding:0 2px}
figure.page{display:inline-block;margin:2px 4px;vertical-align:top;text-align:center}
figure.page figcaption{font-size:.7em;color:#555}
img.thumb{max-height:96px;max-width:120px;border:1px solid #888;cursor:zoom-in;background:#fff}
.budget{margin:.4em 0}.bar{display:flex;height:12px;width:100%;max-width:640px;border:1px solid #999;background:#fff}
.bar span{display:block;height:100%}
.b-sampled{background:#4caf50}.b-obs{background:#5b7fd6}.b-unused{background:#e0e0e0}
.legend{font-size:.8em}.legend .k{display:inline-block;width:10px;height:10px;margin:0 3px 0 8px}
#overlay{display:none;position:fixed;inset:0;background:rgba(0,0,0,.8);align-items:center;justify-content:center;
  cursor:zoom-out}
#overlay img{max-width:95vw;max-height:95vh;background:#fff}
.missing{color:#b00020}
.hidden{display:none}
"""

# Only on pages with a crop, so a batch without crops renders as it did before crops existed.
_CROP_CSS = """
figure.crop{display:inline-block;margin:2px 4px;vertical-align:top;text-align:center}
figure.crop figcaption{font-size:.7em;color:#555}figure.crop.gold img.thumb{border:3px solid #d9a400}
.crop-frame{position:relative;display:inline-block;vertical-align:top;margin-left:4px;border:1px solid #888}
img.crop-source{display:block;max-height:96px;max-width:120px;background:#fff;cursor:zoom-in}
.crop-box{position:absolute;outline:2px solid #e6007e;pointer-events:none}
.crop-note{font-size:.7em;color:#8a4b00;vertical-align:top;margin-left:4px}
"""


_JS = """
function enlarge(img){
  var o=document.getElementById('overlay');o.firstElementChild.src=img.src;o.style.display='flex';
}
document.addEventListener('click',function(e){
  var o=document.getElementById('overlay');
  if(e.target.classList&&e.target.classList.contains('thumb')){enlarge(e.target);}
  else if(e.target===o||e.target.parentNode===o){o.style.display='none';}
});
function filterReason(v){  // the episode table's rows and the sections alike
  document.querySelectorAll('section.episode,tr.ep-row').forEach(function(s){
    s.classList.toggle('hidden', v!=='all' && s.dataset.reason!==v);});
  document.getElementById('shown').textContent=
    document.querySelectorAll('section.episode:not(.hidden)').length;
}
(function(){  // a link may filter (report.html#reason=answered) or open an image (#image=3-1)
  var m=location.hash.match(/^#reason=(.+)$/);
  if(m){var v=decodeURIComponent(m[1]);document.getElementById('reason-filter').value=v;filterReason(v);}
  var i=location.hash.match(/^#image=(\\d+)-(\\d+)$/);
  if(i){var el=document.getElementById('img-'+i[1]+'-'+i[2]);if(el){enlarge(el);}}
})();
"""


def _index(episodes: list[_Episode]) -> str:
    """The table the page opens on: one row per episode; truth and reward columns when any has one."""
    with_truth = any(ep.truth is not None for ep in episodes)
    with_reward = any(ep.reward is not None for ep in episodes)
    names = (["#", "question", "answer"] + ["ground truth"] * with_truth + ["reward"] * with_reward
             + ["doc", "end", "turns", "pages shown"])
    head = "".join(f'<th scope="col">{name}</th>' for name in names)
    rows = "".join(ep.index_row(with_truth, with_reward) for ep in episodes)
    return (f'<table class="episodes"><caption>episodes (a number opens its conversation below)</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")


def _batch(saved: SavedBatch) -> str:
    """The batch's settings and metrics, collapsed: they matter less than the episodes."""
    metrics = "".join(
        f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(_fmt(v))}</td></tr>"
        for k, v in sorted(saved.metrics.items())
    )
    config = {k: saved.config.get(k) for k in ("n", "temperature", "top_p", "response_length", "prompt_length",
                                                "max_turns", "top_n", "page_min_pixels", "page_max_pixels")
              if saved.config.get(k) is not None}
    summary = [
        ("samples", len(saved)), ("model family", saved.model_family or "?"),
        ("action grammar", {True: "yes (constrained logprobs)", False: "no", None: "unknown"}[saved.action_grammar]),
        ("source", saved.source), ("config", json.dumps(config)),
    ]
    return (f'<details class="batch"><summary>batch: model, config and {_count(len(saved.metrics), "metric")}'
            '</summary>'
            f'<div class="summary">{_facts(summary)}</div><table class="metrics">{metrics}</table></details>')


def render(saved: SavedBatch, model_dir: Optional[str] = None, title: str = "rollout",
           truths: Optional[dict] = None) -> str:
    """The whole page as one string."""
    return _page(saved, _episodes(saved, model_dir, truths), title)


def _episodes(saved: SavedBatch, model_dir: Optional[str], truths: Optional[dict]) -> list[_Episode]:
    decode, vision = _decoder(saved, model_dir)
    episodes = [_Episode(saved, row, decode, vision, truths) for row in range(len(saved))]
    for rows in episodes_of(saved).values():
        for index, row in enumerate(rows):
            episodes[row].segment = (int(saved.columns["episode_id"][row]), index, len(rows))
    return episodes


def _page(saved: SavedBatch, episodes: list[_Episode], title: str) -> str:
    sections = [ep.render() for ep in episodes]  # first: rendering counts each episode's crops
    groups = episodes_of(saved)
    if groups:  # a segmented batch: an episode's rows (adjacent) grouped, side by side
        grouped = []
        for episode, rows in groups.items():
            if len(rows) == 1:
                grouped.append(sections[rows[0]])
            else:
                grouped.append(_segment_group(episode, [episodes[r] for r in rows], [sections[r] for r in rows]))
        sections = grouped
    reasons = Counter(str(r) for r in saved.column("termination_reason"))
    options = '<option value="all">all</option>' + "".join(
        f'<option value="{html.escape(r)}">{html.escape(r)} ({c})</option>' for r, c in sorted(reasons.items())
    )
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{_CSS}{_CROP_CSS if any(ep.crops for ep in episodes) else ''}"
        f"{_SEGMENT_CSS if groups else ''}"
        "</style></head><body>"
        f"<header><h1>{html.escape(title)}</h1><p class=\"lead\">{_count(len(saved), 'episode')} · "
        f"{html.escape(saved.model_family or 'model family unknown')} · <label>termination reason "
        f"<select id=\"reason-filter\" onchange=\"filterReason(this.value)\">{options}</select></label> "
        f"showing <span id=\"shown\">{len(saved)}</span> of {len(saved)} · "
        "<span class=\"sampled\">sampled (loss mask 1)</span> <span class=\"obs\">observation (loss mask 0)</span>"
        f"</p></header><main>{_index(episodes)}{_batch(saved)}"
        + "".join(sections)
        + f"</main><div id=\"overlay\"><img alt=\"enlarged image\"></div><script>{_JS}</script></body></html>"
    )


def _facts(pairs: list) -> str:
    return " ".join(f'<span class="fact"><b>{html.escape(k)}</b> {html.escape(str(v))}</span>' for k, v in pairs)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_html(path: str | Path, out_html: str | Path, model_dir: Optional[str | Path] = None,
               truths: Optional[str | Path] = None) -> Path:
    """Read a saved batch (or pickled trainer DataProto) and write its HTML view; returns the path.
    `truths`: a file of ground truths for a batch without them (`episode_facts.load_truths`);
    when it holds no question of the batch, `TruthsMatchNothing` and nothing is written; when it
    lacks some, a one-line warning on stderr counts them."""
    try:
        saved = load_rollout(path)
        known = None if truths is None else facts.load_truths(truths)
    except ValueError as e:  # NotABatchError, or a truths file of another shape
        raise ViewInputError(str(e)) from e
    episodes = _episodes(saved, None if model_dir is None else str(model_dir), known)
    if known is not None:
        warning = check_truths_match(truths, known, [ep.question for ep in episodes])
        if warning:
            print(warning, file=sys.stderr)
    page = _page(saved, episodes, title=f"rollout {Path(path).name}")
    out = Path(out_html)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


def check_truths_match(truths_path: str | Path, truths: dict, asked: Sequence[str]) -> Optional[str]:
    """The batch's questions (`asked`, per row) against a truths file's: None when the file has
    each one; a warning line counting those it lacks; `TruthsMatchNothing` when it has none (the
    wrong file: a page without ground truths is not what was asked for)."""
    batch_questions = list(dict.fromkeys(asked))  # a question once, however many samples asked it
    lacking = [question for question in batch_questions if facts.comparable(question) not in truths]
    if not lacking:
        return None
    if len(lacking) < len(batch_questions):
        return (f"view: warning: --truths {truths_path} has no ground truth for {len(lacking)} of the batch's "
                f"{_count(len(batch_questions), 'question')} (e.g. {_shortened(lacking[0])}): their episodes show none")
    held = _count(len(truths), "question") + (f" (e.g. {_shortened(next(iter(truths)))})" if truths else "")
    raise TruthsMatchNothing(f"--truths {truths_path} holds no question of the batch: it holds {held}, the batch "
                             f"asks {len(batch_questions)} (e.g. {_shortened(batch_questions[0])}); nothing written")


def _shortened(question: str) -> str:
    return repr(textwrap.shorten(question, width=60, placeholder="…"))


def main(path: str | Path, out_html: str | Path, model_dir: Optional[str] = None,
         truths: Optional[str | Path] = None) -> int:
    try:
        out = write_html(path, out_html, model_dir, truths=truths)
    except (ViewInputError, FileNotFoundError) as e:  # one line on stderr, no page (TruthsMatchNothing too)
        print(f"view: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0
