"""`vrag-rollout view`: a saved rollout batch as one self-contained, static HTML page.

`write_html(path, out_html, model_dir=None) -> Path` reads a saved batch (or a pickled trainer
DataProto, see saved_batch.py) and writes a page that needs no server and no network: images are
embedded as data URIs, the little CSS and JavaScript are inline. The page shows

- at the top: the file, the model family, whether an action grammar was active, the rollout
  config's main settings and the batch's metrics; a filter by termination reason (also set by
  the link: `report.html#reason=answered`);
- one section per episode (`<section class="episode" data-reason=...>`): the conversation as the
  model saw it (the prompt, collapsed, then the response), sampled text (loss mask 1) and
  observation blocks (loss mask 0) styled apart, every image as a thumbnail where its image
  tokens sit (`<img class="thumb" id="img-ROW-K">`; click to enlarge, or open the link
  `report.html#image=ROW-K`), the page ids of each observation, the
  termination reason, turns/searches/fetches, and a bar of the response budget: sampled,
  observation and unused tokens.

Text is decoded with the batch's own token texts (saved by `save_rollout`) or, when given or when
the batch has none, with the tokenizer of `model_dir`. All text is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import json
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

from .saved_batch import NotABatchError, SavedBatch, load_rollout

IMAGE_PAD, VISION_START, VISION_END = "<|image_pad|>", "<|vision_start|>", "<|vision_end|>"


class ViewInputError(ValueError):
    """The batch cannot be viewed (no token texts and no tokenizer, not a batch)."""


def _mime(data: bytes) -> str:
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return "application/octet-stream"


def data_uri(data: bytes) -> str:
    return f"data:{_mime(data)};base64,{base64.b64encode(data).decode('ascii')}"


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


def _runs(flags: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of a 0/1 list."""
    out, start = [], 0
    for i in range(1, len(flags) + 1):
        if i == len(flags) or flags[i] != flags[start]:
            out.append((flags[start], start, i))
            start = i
    return [run for run in out if run[2] > run[1]]


class _Episode:
    """Renders one sample; images are numbered in sequence order across prompt and response."""

    def __init__(self, saved: SavedBatch, row: int, decode: Callable, vision: dict[str, int]):
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
        self.images = saved.images[row]
        self.next_image = 0

    def _image(self, caption: str, tokens: int) -> str:
        k = self.next_image
        self.next_image += 1
        if k >= len(self.images):
            return f'<span class="missing">[image {k}: {tokens} image tokens, no saved image]</span>'
        label = html.escape(f"image {k}: {caption}{tokens} tokens")
        return (f'<figure class="page"><img class="thumb" id="img-{self.row}-{k}" alt="{label}" title="{label}" '
                f'src="{data_uri(self.images[k])}"><figcaption>{label}</figcaption></figure>')

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
                out.append(self._image(captions.pop(0) + " · " if captions else "", j - i - 1))
                i = j + 1 if j < len(ids) and ids[j] == end else j
                continue
            text.append(ids[i])
            i += 1
        out.append(html.escape(self.decode(text)))
        return "".join(out)

    def render(self) -> str:
        saved, row = self.saved, self.row
        reason = saved.column("termination_reason")[row]
        page_ids = saved.column("page_ids", [])[row] or []
        counters = {name: saved.column(name)[row] for name in ("num_turns", "num_searches", "num_fetches")}
        prompt_images = sum(1 for a, b in zip(self.prompt_ids, self.prompt_ids[1:])
                            if a == self.vision[VISION_START] and b == self.vision[IMAGE_PAD])
        prompt = self._text_with_images(self.prompt_ids, ["prompt"] * prompt_images)
        parts, observation = [], 0
        for value, start, end in _runs(self.loss):
            ids = self.response_ids[start:end]
            if value:
                text = self._text_with_images(ids, [])
                parts.append(f'<span class="sampled" data-pos="{self.P + start}">{text}</span>')
                continue
            pages = page_ids[observation] if observation < len(page_ids) else []
            observation += 1
            tag = (f'<span class="obs-tag">pages: {html.escape(", ".join(map(str, pages)))}</span>' if pages
                   else '<span class="obs-tag">observation</span>')
            parts.append(f'<span class="obs" data-pos="{self.P + start}">{tag}'
                         f'{self._text_with_images(ids, [str(p) for p in pages])}</span>')
        if self.next_image < len(self.images):  # a broken batch: show what no image tokens point at
            extra = "".join(self._image("no image tokens · ", 0) for _ in range(len(self.images) - self.next_image))
            parts.append(f'<div class="missing">saved images without image tokens: {extra}</div>')
        sampled = sum(self.loss)
        observed = self.used - sampled
        unused = self.R - self.used
        bar = "".join(
            f'<span class="{cls}" style="width:{100 * count / max(self.R, 1):.3f}%" title="{label}: {count}"></span>'
            for cls, label, count in (("b-sampled", "sampled", sampled), ("b-obs", "observation", observed),
                                      ("b-unused", "unused", unused))
        )
        all_pages = [str(p) for turn in page_ids for p in (turn or [])]
        facts = [
            ("doc", saved.column("doc_id")[row]), ("end", reason), ("turns", counters["num_turns"]),
            ("searches", counters["num_searches"]), ("fetches", counters["num_fetches"]),
            ("images", len(self.images)), ("pages", ", ".join(all_pages) or "-"),
        ]
        facts_html = _facts(facts)
        return (
            f'<section class="episode" id="ep-{row}" data-reason="{html.escape(str(reason))}">'
            f'<h2>episode {row}</h2><div class="facts">{facts_html}</div>'
            f'<div class="budget"><div class="bar">{bar}</div><div class="legend">'
            f'<span class="k b-sampled"></span>sampled {sampled} <span class="k b-obs"></span>observation {observed} '
            f'<span class="k b-unused"></span>unused {unused} of {self.R}</div></div>'
            f'<details class="prompt"><summary>prompt ({len(self.prompt_ids)} tokens, {prompt_images} images)</summary>'
            f'<div class="conv">{prompt}</div></details>'
            f'<div class="conv response">{"".join(parts)}</div></section>'
        )


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;background:#fafafa;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin:.2em 0}
table.metrics{border-collapse:collapse;font-size:.85em}table.metrics td{border:1px solid #ddd;padding:2px 8px}
.episode{background:#fff;border:1px solid #ccc;border-radius:6px;padding:.8em;margin:1em 0}
.fact{display:inline-block;margin-right:1em;font-size:.9em}
.conv{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:.82em;line-height:1.5}
.sampled{background:#e3f4e1;border-bottom:2px solid #4caf50}
.obs{background:#e8eefb;border:1px dashed #5b7fd6;display:inline;color:#333}
.obs-tag{font-family:system-ui,sans-serif;font-size:.75em;background:#5b7fd6;color:#fff;padding:0 4px;
  margin-right:4px;border-radius:3px}
figure.page{display:inline-block;margin:2px 4px;vertical-align:top;text-align:center}
figure.page figcaption{font-size:.7em;color:#555}
img.thumb{max-height:96px;max-width:120px;border:1px solid #888;cursor:zoom-in;background:#fff}
.budget{margin:.4em 0}.bar{display:flex;height:12px;width:100%;max-width:640px;border:1px solid #999;background:#fff}
.bar span{display:block;height:100%}
.b-sampled{background:#4caf50}.b-obs{background:#5b7fd6}.b-unused{background:#e0e0e0}
.legend{font-size:.8em}.legend .k{display:inline-block;width:10px;height:10px;margin:0 3px 0 8px}
.prompt summary{cursor:pointer;font-size:.85em;color:#555}
#overlay{display:none;position:fixed;inset:0;background:rgba(0,0,0,.8);align-items:center;justify-content:center;
  cursor:zoom-out}
#overlay img{max-width:95vw;max-height:95vh;background:#fff}
.missing{color:#b00020}
.hidden{display:none}
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
function filterReason(v){
  document.querySelectorAll('section.episode').forEach(function(s){
    s.classList.toggle('hidden', v!=='all' && s.dataset.reason!==v);});
  document.getElementById('shown').textContent=
    document.querySelectorAll('section.episode:not(.hidden)').length;
}
(function(){  // a link may filter (report.html#reason=answered) or open an image (#image=3-1)
  var m=location.hash.match(/^#reason=(.+)$/);
  if(m){var v=decodeURIComponent(m[1]);document.getElementById('reason-filter').value=v;filterReason(v);}
  var i=location.hash.match(/^#image=(\d+)-(\d+)$/);
  if(i){var el=document.getElementById('img-'+i[1]+'-'+i[2]);if(el){enlarge(el);}}
})();
"""


def render(saved: SavedBatch, model_dir: Optional[str] = None, title: str = "rollout") -> str:
    """The whole page as one string."""
    decode, vision = _decoder(saved, model_dir)
    episodes = [_Episode(saved, row, decode, vision).render() for row in range(len(saved))]
    reasons = Counter(str(r) for r in saved.column("termination_reason"))
    options = '<option value="all">all</option>' + "".join(
        f'<option value="{html.escape(r)}">{html.escape(r)} ({c})</option>' for r, c in sorted(reasons.items())
    )
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
    summary_html = _facts(summary)
    return (
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><div class=\"summary\">{summary_html}</div>"
        f"<details open><summary>metrics</summary><table class=\"metrics\">{metrics}</table></details>"
        f"<p><label>termination reason <select id=\"reason-filter\" onchange=\"filterReason(this.value)\">{options}"
        f"</select></label> showing <span id=\"shown\">{len(saved)}</span> of {len(saved)} episodes · "
        "<span class=\"sampled\">sampled (loss mask 1)</span> <span class=\"obs\">observation (loss mask 0)</span></p>"
        + "".join(episodes)
        + f"<div id=\"overlay\"><img alt=\"enlarged image\"></div><script>{_JS}</script></body></html>"
    )


def _facts(pairs: list) -> str:
    return " ".join(f'<span class="fact"><b>{html.escape(k)}</b> {html.escape(str(v))}</span>' for k, v in pairs)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_html(path: str | Path, out_html: str | Path, model_dir: Optional[str | Path] = None) -> Path:
    """Read a saved batch (or pickled trainer DataProto) and write its HTML view; returns the path."""
    try:
        saved = load_rollout(path)
    except NotABatchError as e:
        raise ViewInputError(str(e)) from e
    page = render(saved, None if model_dir is None else str(model_dir), title=f"rollout {Path(path).name}")
    out = Path(out_html)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


def main(path: str | Path, out_html: str | Path, model_dir: Optional[str] = None) -> int:
    try:
        out = write_html(path, out_html, model_dir)
    except (ViewInputError, FileNotFoundError) as e:
        print(f"error: {e}")
        return 2
    print(f"wrote {out}")
    return 0
