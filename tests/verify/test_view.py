"""`vrag-rollout view`: the HTML page of a real rollout, parsed and rendered in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from html.parser import HTMLParser

import numpy as np
import pytest
import torch
from PIL import Image

from tests.verify.helpers import pickled_trainer_batch
from vrag_rollout.cli import main as cli_main
from vrag_rollout.verify.saved_batch import load_rollout
from vrag_rollout.verify.view import ViewInputError, write_html

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)"
)


class _Elements(HTMLParser):
    """Tags with their attributes, in document order."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def elements(page: str) -> list[tuple[str, dict]]:
    parser = _Elements()
    parser.feed(page)
    return parser.tags


def classes(attrs: dict) -> set[str]:
    return set((attrs.get("class") or "").split())


@pytest.fixture(scope="module")
def report(grammar_rollout, tmp_path_factory):
    out = tmp_path_factory.mktemp("view") / "report.html"
    assert cli_main(["view", str(grammar_rollout.path), "-o", str(out)]) == 0
    return out


def test_one_section_per_episode_and_one_thumbnail_per_image(report, grammar_rollout):
    saved = load_rollout(grammar_rollout.path)
    tags = elements(report.read_text())
    sections = [a for t, a in tags if t == "section" and "episode" in classes(a)]
    thumbs = [a for t, a in tags if t == "img" and "thumb" in classes(a)]
    assert len(sections) == len(saved)
    assert [a["data-reason"] for a in sections] == saved.columns["termination_reason"]
    assert len(thumbs) == sum(len(images) for images in saved.images) > 0
    assert all(a["src"].startswith("data:image/png;base64,") for a in thumbs)


def test_the_page_is_self_contained(report):
    tags = elements(report.read_text())
    for tag, attrs in tags:
        for name in ("src", "href"):
            value = attrs.get(name)
            assert value is None or value.startswith(("data:", "#")), (tag, attrs)
        assert not (tag == "link" or (tag == "script" and "src" in attrs))


def test_budget_bar_and_loss_mask_styling(report, grammar_rollout):
    saved = load_rollout(grammar_rollout.path)
    page = report.read_text()
    P, R = saved.tensors["prompts"].shape[1], saved.tensors["responses"].shape[1]
    legends = re.findall(r"sampled (\d+) .*?observation (\d+) .*?unused (\d+) of (\d+)", page)
    assert len(legends) == len(saved)
    for row, (sampled, observed, unused, total) in enumerate(legends):
        used = int(saved.tensors["attention_mask"][row, P:].sum())
        loss = int(saved.tensors["loss_mask"][row].sum())
        assert (int(sampled), int(observed), int(unused), int(total)) == (loss, used - loss, R - used, R)
    tags = elements(page)
    assert sum(1 for t, a in tags if t == "span" and "obs" in classes(a)) > 0
    assert sum(1 for t, a in tags if t == "span" and "sampled" in classes(a)) > len(saved)


def test_text_is_escaped(grammar_rollout, tmp_path):
    saved = load_rollout(grammar_rollout.path)
    saved.columns["doc_id"][0] = "<script>alert('doc')</script>"
    token = int(saved.tensors["responses"][0, 0])
    saved.token_text[token] = "<img src=x onerror=alert(1)>"
    saved.metrics["<b>metric</b>"] = 1.0
    path = tmp_path / "hostile.pt"
    torch.save(saved.to_dict(), path)
    page = write_html(path, tmp_path / "hostile.html").read_text()
    assert "<script>alert" not in page and "<img src=x" not in page and "<b>metric" not in page
    assert "&lt;script&gt;alert(&#x27;doc&#x27;)" in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def test_images_without_image_tokens_are_shown_apart(grammar_rollout):
    from vrag_rollout.verify.view import render

    saved = load_rollout(grammar_rollout.path)
    row = next(r for r in range(len(saved)) if not saved.images[r])
    saved.images[row].append(saved.images[next(r for r in range(len(saved)) if saved.images[r])][0])
    page = render(saved)
    assert page.count("saved images without image tokens") == 1
    assert page.count('class="thumb"') == sum(len(images) for images in saved.images)


def test_not_a_batch_is_a_clear_error(tmp_path, capsys):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"nope")
    assert cli_main(["view", str(junk), "-o", str(tmp_path / "out.html")]) == 2
    assert "not a saved rollout batch" in capsys.readouterr().err
    assert not (tmp_path / "out.html").exists()


def test_trainer_batch_needs_a_tokenizer(grammar_rollout, tmp_path):
    import verl.protocol  # noqa: F401  (part of the test extra: missing fails, never skips)
    path = pickled_trainer_batch(grammar_rollout.output, tmp_path / "batch.pkl")
    with pytest.raises(ViewInputError, match="--model"):
        write_html(path, tmp_path / "no.html")
    page = write_html(path, tmp_path / "yes.html", model_dir=grammar_rollout.model_dir).read_text()
    assert page.count('class="episode"') == len(grammar_rollout.output)


def _chromium(*args: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", *args],
        capture_output=True, text=True, timeout=180, check=True,
    )


@needs_chromium
def test_rendered_in_headless_chromium(report, grammar_rollout, tmp_path):
    saved = load_rollout(grammar_rollout.path)
    url = report.resolve().as_uri()
    dom = _chromium("--dump-dom", url, tmp_path=tmp_path).stdout
    tags = elements(dom)  # the DOM after the page's own script ran
    sections = [a for t, a in tags if t == "section" and "episode" in classes(a)]
    assert len(sections) == len(saved)
    assert sum(1 for t, a in tags if t == "img" and "thumb" in classes(a)) == sum(len(i) for i in saved.images)

    reasons = Counter(saved.columns["termination_reason"])
    reason, count = min(reasons.items(), key=lambda kv: kv[1])
    filtered = elements(_chromium("--dump-dom", f"{url}#reason={reason}", tmp_path=tmp_path).stdout)
    shown = [a for t, a in filtered if t == "section" and "episode" in classes(a) and "hidden" not in classes(a)]
    assert len(shown) == count and all(a["data-reason"] == reason for a in shown)

    row = next(r for r in range(len(saved)) if len(saved.images[r]) > 1)
    opened = elements(_chromium("--dump-dom", f"{url}#image={row}-1", tmp_path=tmp_path).stdout)
    overlay = next(i for i, (t, a) in enumerate(opened) if a.get("id") == "overlay")
    assert "display: flex" in opened[overlay][1].get("style", "")  # the enlarged view is open ...
    thumb = next(a for t, a in opened if a.get("id") == f"img-{row}-1")
    assert opened[overlay + 1][1]["src"] == thumb["src"]  # ... on that image

    shot = tmp_path / "shot.png"
    _chromium("--window-size=1280,1600", f"--screenshot={shot}", url, tmp_path=tmp_path)
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert pixels.shape[:2] == (1600, 1280)
    assert pixels.std() > 20  # not a blank page
    green = np.all(np.abs(pixels - [0x4C, 0xAF, 0x50]) < 12, axis=-1).sum()  # the budget bars' sampled part
    blue = np.all(np.abs(pixels - [0x5B, 0x7F, 0xD6]) < 12, axis=-1).sum()  # observation part and tags
    assert green > 200 and blue > 200
