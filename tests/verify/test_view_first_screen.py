"""`vrag-rollout view`'s first screen: the episodes (question, ground truth, reward, why a budget
end happened) before the batch's numbers, on real rollouts, read from the page's DOM and from
headless Chromium's layout of a 1280x800 viewport.

Ground truths and rewards are added to a real batch the way a producer that knows them would:
`ground_truth` (core.reward's JSON) and `reward` (`training.learn.episode_scores`, the project's
reward) columns. The view only shows them: verify/ does not import the reward.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Optional

import numpy as np
import pytest
import torch
from PIL import Image

from retriever_server.sample_corpus import SAMPLE_FACTS
from tests.rollout.agent_helpers import sample_prompts
from tests.verify.helpers import N, roll
from vrag_rollout.cli import main as cli_main
from vrag_rollout.training.learn import episode_scores
from vrag_rollout.verify import episode_facts
from vrag_rollout.verify.saved_batch import load_rollout
from vrag_rollout.verify.view import render, write_html

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)"
)
VOID = {"img", "br", "meta", "input", "hr", "link", "source", "wbr"}


# --------------------------------------------------------------------------- a small DOM


@dataclass
class Node:
    tag: str
    attrs: dict
    parent: Optional["Node"] = None
    children: list = field(default_factory=list)  # Node or str

    @property
    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())

    @property
    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text for c in self.children)

    def find_all(self, tag: str, cls: Optional[str] = None) -> list["Node"]:
        out = []
        for child in self.children:
            if isinstance(child, Node):
                if child.tag == tag and (cls is None or cls in child.classes):
                    out.append(child)
                out += child.find_all(tag, cls)
        return out

    def ancestors(self) -> list["Node"]:
        node, out = self.parent, []
        while node is not None:
            out.append(node)
            node = node.parent
        return out


class _Tree(HTMLParser):
    def __init__(self):
        super().__init__()
        self.root = self.at = Node("#document", {})

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs), self.at)
        self.at.children.append(node)
        if tag not in VOID:
            self.at = node

    def handle_endtag(self, tag):
        node = self.at
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.at = node.parent

    def handle_data(self, data):
        self.at.children.append(data)


def dom(page: str) -> Node:
    tree = _Tree()
    tree.feed(page)
    return tree.root


def text(node: Node) -> str:
    return " ".join(node.text.split())


# --------------------------------------------------------------------------- batches


def questions(count: int) -> list[str]:
    return [sample.question for sample in sample_prompts(count)]


def truth_of(asked: str) -> dict:
    """core.reward's ground truth of a demo question ("Which page covers <fact>?")."""
    doc, page = SAMPLE_FACTS[asked.removeprefix("Which page covers ").removesuffix("?")]
    return {"answer": str(page), "doc_id": doc, "gold_pages": [page]}


@dataclass
class Scored:
    path: object
    html: object
    questions: list  # per row
    truths: list  # per row
    scores: list  # per row


@pytest.fixture(scope="module")
def scored(grammar_rollout, tiny_processor, tmp_path_factory) -> Scored:
    """The grammar rollout saved as a producer that knows its ground truths would save it."""
    saved = load_rollout(grammar_rollout.path)
    asked = questions(len(saved) // N)
    truths = [truth_of(q) for q in asked]
    scores = episode_scores(grammar_rollout.output, tiny_processor.tokenizer, truths)
    saved.columns["ground_truth"] = [json.dumps(truths[row // N]) for row in range(len(saved))]
    saved.columns["reward"] = scores
    folder = tmp_path_factory.mktemp("scored")
    torch.save(saved.to_dict(), folder / "scored.pt")
    out = folder / "scored.html"
    assert cli_main(["view", str(folder / "scored.pt"), "-o", str(out)]) == 0
    return Scored(folder / "scored.pt", out, [asked[row // N] for row in range(len(saved))],
                  [truths[row // N] for row in range(len(saved))], scores)


@pytest.fixture(scope="module")
def budget_rollout(tiny_model_dir, tiny_processor, tiny_llm, tmp_path_factory):
    """A real rollout with a response budget (56 tokens) too small for most results."""
    path = tmp_path_factory.mktemp("budget") / "budget.pt"
    return roll(tiny_model_dir, tiny_processor, tiny_llm, sample_prompts(6, with_images=False), path,
                response_length=56)


# --------------------------------------------------------------------------- the page's order


def test_the_page_opens_on_the_episodes_and_keeps_the_metrics_collapsed(scored):
    html_text = scored.html.read_text()
    page = dom(html_text)
    table = page.find_all("table", "episodes")[0]
    batch = page.find_all("details", "batch")[0]
    sections = page.find_all("section", "episode")
    assert html_text.index('class="episodes"') < html_text.index('class="batch"') < html_text.index(
        'class="episode"')
    assert "open" not in batch.attrs  # the metrics are one click away, not on the first screen
    assert batch.find_all("table", "metrics") and not table.find_all("details")
    assert len(table.find_all("tr", "ep-row")) == len(sections) == len(scored.questions)
    head = [text(th) for th in table.find_all("th")]
    assert head == ["#", "question", "answer", "ground truth", "reward", "doc", "end", "turns", "pages shown"]


def test_each_episode_shows_its_question_uncollapsed(scored):
    page = dom(scored.html.read_text())
    saved = load_rollout(scored.path)
    rows = page.find_all("tr", "ep-row")
    sections = page.find_all("section", "episode")
    for row, (tr, section) in enumerate(zip(rows, sections)):
        cells = tr.find_all("td")
        assert text(cells[1]) == scored.questions[row]
        assert text(cells[5]) == saved.columns["doc_id"][row]
        assert text(cells[6]).split()[0] == saved.columns["termination_reason"][row]
        assert text(cells[7]) == str(saved.columns["num_turns"][row])
        shown = [p for turn in saved.columns["page_ids"][row] for p in turn]
        assert text(cells[8]).replace(" (gold)", "") == (", ".join(shown) or "-")
        question = section.find_all("p", "question")[0]
        assert text(question) == f"question {scored.questions[row]}"
        assert not any(a.tag == "details" for a in question.ancestors())


def test_ground_truth_and_reward_per_episode(scored):
    page = dom(scored.html.read_text())
    for row, (tr, section) in enumerate(zip(page.find_all("tr", "ep-row"), page.find_all("section", "episode"))):
        truth, score = scored.truths[row], scored.scores[row]
        gold = f"{truth['doc_id']}_{truth['gold_pages'][0]}"
        assert text(tr.find_all("td", "truth")[0]) == f"{truth['answer']} (gold: {gold})"
        assert text(tr.find_all("td", "reward")[0]) == f"{score['overall']:.2f}"
        parts = " · ".join(f"{name} {score[name]:.2f}" for name in ("accuracy", "f1", "format", "retrieval"))
        assert text(section.find_all("p", "reward")[0]) == f"reward {score['overall']:.2f} ({parts})"
        assert text(section.find_all("p", "truth")[0]) == f"ground truth {truth['answer']} (gold: {gold})"


def test_gold_pages_are_marked_among_the_shown_pages(scored):
    saved = load_rollout(scored.path)
    row = next(r for r in range(len(saved)) if any(saved.columns["page_ids"][r]))
    page_id = next(p for turn in saved.columns["page_ids"][row] for p in turn)
    doc, _, number = page_id.rpartition("_")  # make one shown page a gold page of its episode
    saved.columns["ground_truth"][row] = json.dumps({"answer": "x", "doc_id": doc, "gold_pages": [int(number)]})
    page = dom(render(saved))
    for r, (tr, section) in enumerate(zip(page.find_all("tr", "ep-row"), page.find_all("section", "episode"))):
        truth = json.loads(saved.columns["ground_truth"][r])
        gold = {f"{truth['doc_id']}_{p}" for p in truth["gold_pages"]}
        shown = [p for turn in saved.columns["page_ids"][r] for p in turn]
        assert [text(m) for m in tr.find_all("mark", "gold")] == [f"{p} (gold)" for p in shown if p in gold]
        assert {text(m) for m in section.find_all("mark", "gold")} == {f"{p} (gold)" for p in shown if p in gold}
        for figure in section.find_all("figure", "gold"):  # a gold page's thumbnail is framed
            assert any(p in figure.find_all("img")[0].attrs["alt"] for p in gold)
    assert page.find_all("tr", "ep-row")[row].find_all("mark", "gold")


def test_reward_from_easyr1_token_level_scores(grammar_rollout):
    saved = load_rollout(grammar_rollout.path)
    R = saved.tensors["responses"].shape[1]
    scores = torch.zeros(len(saved), R)
    scores[:, -1] = torch.linspace(0, 1, len(saved))  # EasyR1: the score on one token of the row
    saved.tensors["token_level_scores"] = scores
    page = dom(render(saved))
    cells = [text(td) for td in page.find_all("td", "reward")]
    assert cells == [f"{float(v):.2f}" for v in torch.linspace(0, 1, len(saved))]
    assert not page.find_all("td", "truth")  # no ground truth in this batch: no column for it


def test_a_batch_without_truths_or_rewards_has_no_such_columns(grammar_rollout):
    page = dom(render(load_rollout(grammar_rollout.path)))
    assert not page.find_all("td", "truth") and not page.find_all("td", "reward")
    assert not page.find_all("p", "reward")


def test_truths_from_a_converted_dataset_or_a_json_file(grammar_rollout, tmp_path):
    from vrag_rollout.data.dataset import convert_dataset

    asked = questions(len(load_rollout(grammar_rollout.path)) // N)
    source = tmp_path / "questions.jsonl"
    source.write_text("".join(json.dumps({
        "uid": f"q{i}", "query": q, "reference_answer": truth_of(q)["answer"],
        "meta_info": {"file_name": f"{truth_of(q)['doc_id']}.pdf", "reference_page": truth_of(q)["gold_pages"]},
    }) + "\n" for i, q in enumerate(asked)))
    convert_dataset(source, tmp_path / "questions.parquet")
    (tmp_path / "truths.json").write_text(json.dumps({q: truth_of(q) for q in asked}))
    for truths in ("questions.parquet", "truths.json"):
        out = tmp_path / f"{truths}.html"
        assert cli_main(["view", str(grammar_rollout.path), "-o", str(out), "--truths", str(tmp_path / truths)]) == 0
        page = dom(out.read_text())
        got = [text(td) for td in page.find_all("td", "truth")]
        want = []
        for row in range(len(got)):
            truth = truth_of(asked[row // N])
            want.append(f"{truth['answer']} (gold: {truth['doc_id']}_{truth['gold_pages'][0]})")
        assert got == want and len(got) == 2 * len(asked)
        assert [text(p) for p in page.find_all("p", "reward")] == ["reward not in the batch"] * len(got)


def test_a_bad_truths_file_is_a_clear_error(grammar_rollout, tmp_path, capsys):
    bad = tmp_path / "truths.json"
    bad.write_text("[1, 2]")
    assert cli_main(["view", str(grammar_rollout.path), "-o", str(tmp_path / "o.html"), "--truths", str(bad)]) == 2
    assert "expected a JSON object" in capsys.readouterr().err
    assert cli_main(["view", str(grammar_rollout.path), "-o", str(tmp_path / "o.html"),
                     "--truths", str(tmp_path / "missing.json")]) == 2
    assert "no such truths file" in capsys.readouterr().err
    assert not (tmp_path / "o.html").exists()


# --------------------------------------------------------------------------- budget endings


def test_a_budget_end_says_which_turn_and_what_did_not_fit(budget_rollout, tiny_processor):
    saved = load_rollout(budget_rollout.path)
    page = dom(write_html(budget_rollout.path, budget_rollout.path.with_suffix(".html")).read_text())
    t = saved.tensors
    P, R = t["prompts"].shape[1], t["responses"].shape[1]
    budget = [r for r, reason in enumerate(saved.columns["termination_reason"]) if reason == "budget"]
    assert budget, "the 56-token budget ended no episode on its budget"
    sections, rows = page.find_all("section", "episode"), page.find_all("tr", "ep-row")
    for row in range(len(saved)):
        notes = sections[row].find_all("p", "note")
        if row not in budget:
            assert not notes
            continue
        note, turn = text(notes[0]), saved.columns["num_turns"][row]
        used = int(t["attention_mask"][row, P:].sum())
        loss = t["loss_mask"][row, :used].tolist()
        last_sampled = max(i for i, v in enumerate(loss) if v)  # the last turn's sampled run ends here
        start = last_sampled
        while start > 0 and loss[start - 1]:
            start -= 1
        turn_text = tiny_processor.tokenizer.decode(t["responses"][row, start:last_sampled + 1].tolist())
        kind = "search" if "<search>" in turn_text else "fetch"  # the grammar: one action per turn
        body = turn_text.rsplit(f"<{kind}>", 1)[1].split(f"</{kind}>")[0].strip()
        assert note.startswith(f"budget the result of turn {turn} ({kind} {body}"), (note, turn_text)
        overflow = saved.columns["budget_overflow"][row]
        if loss[-1] == 0 and used == R:  # the result came in and filled the response
            assert overflow is None
            assert "filled the response to its last token" in note
            assert all(p in note for p in saved.columns["page_ids"][row][-1])
        else:  # the rollout recorded what did not fit: the pages and their size
            assert overflow["remaining"] == R - used < overflow["tokens"] and overflow["turn"] == turn
            assert f"({overflow['tokens']} tokens) did not fit the {R - used} tokens left of {R}" in note
            assert all(p in note for p in overflow["page_ids"])
        assert f"turn {turn}" in text(rows[row].find_all("td", "end")[0])


def test_a_recorded_overflow_is_named_with_its_pages():
    note = episode_facts.budget_note(
        turn=2, last_sampled="<search>x</search>", last_is_observation=False, remaining=40, length=512,
        overflow={"turn": 2, "tokens": 70, "remaining": 40, "page_ids": ["report_3", "report_5"]})
    assert note == ("the result of turn 2 (search x): report_3, report_5 (70 tokens) did not fit the 40 tokens "
                    "left of 512")


def test_budget_note_of_a_tool_call_turn():
    turn = ('<think>t</think>\n<tool_call>\n{"name": "search", "arguments": {"query": "a b"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "fetch", "arguments": {"page": 3, "mode": "image"}}\n</tool_call><|im_end|>')
    note = episode_facts.budget_note(turn=3, last_sampled=turn, last_is_observation=False, remaining=70, length=768)
    assert note.startswith('the result of turn 3 (search {"query": "a b"}; fetch {"page": 3, "mode": "image"}) '
                           "did not fit the 70 tokens left of 768")


# --------------------------------------------------------------------------- the question


@pytest.mark.parametrize("prompt, expected", [
    ("<|im_start|>system\nYou help.<|im_end|>\n<|im_start|>user\nDo this.\nQuestion: Which page?<|im_end|>\n"
     "<|im_start|>assistant\n", "Which page?"),
    ("<|im_start|>user\nDo this.\nQuestion: What does \"\nQuestion: \" mean?<|im_end|>\n",
     'What does "\nQuestion: " mean?'),  # the first mark ends the instructions
    ("<|im_start|>user\nfirst<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n<|im_start|>user\nJust ask.<|im_end|>\n"
     "<|im_start|>assistant\n", "Just ask."),
    ("no chat template at all", "no chat template at all"),
], ids=["marker", "first-marker", "no-marker-last-user-turn", "no-chat-template"])
def test_the_question_is_read_from_the_prompt(prompt, expected):
    assert episode_facts.question(prompt) == expected.strip()


# --------------------------------------------------------------------------- in a browser

# Appended to a copy of the page: after layout, where the first episode's row, question and
# reward sit in the viewport, whether they are visible and on top, and whether the metrics are.
PROBE = """<script>
window.addEventListener('load', function(){
  function at(el){
    if(!el) return null;
    var r=el.getBoundingClientRect(), x=(r.left+r.right)/2, y=(r.top+r.bottom)/2;
    var hit=(x>=0&&y>=0&&x<innerWidth&&y<innerHeight)?document.elementFromPoint(x,y):null;
    return {text:el.textContent, top:r.top, bottom:r.bottom, left:r.left, right:r.right,
            visible:el.checkVisibility(), on_top:!!hit&&(hit===el||el.contains(hit))};
  }
  var row=document.querySelector('tr.ep-row');
  var out={width:innerWidth, height:innerHeight, scroll:scrollY, row:at(row),
           number:at(row.querySelector('a')), question:at(row.querySelector('td.question')),
           reward:at(row.querySelector('td.reward')), metrics:at(document.querySelector('table.metrics'))};
  var pre=document.createElement('pre');pre.id='probe';pre.textContent=JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _chromium(*args: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--window-size=1280,800", *args],
        capture_output=True, text=True, timeout=180, check=True,
    )


@needs_chromium
def test_the_first_screen_shows_an_episode_its_question_and_its_reward(scored, tmp_path):
    probe_page = tmp_path / "probe.html"
    probe_page.write_text(scored.html.read_text().replace("</body>", PROBE + "</body>"))
    probe_dom = dom(_chromium("--dump-dom", probe_page.resolve().as_uri(), tmp_path=tmp_path).stdout)
    probe = json.loads(next(n for n in probe_dom.find_all("pre") if n.attrs.get("id") == "probe").text)
    assert probe["width"] == 1280 and 600 <= probe["height"] <= 800 and probe["scroll"] == 0
    for name in ("row", "number", "question", "reward"):
        box = probe[name]
        assert box["visible"] and box["on_top"], (name, box)
        assert 0 <= box["top"] < box["bottom"] <= probe["height"] and 0 <= box["left"] < box["right"] <= 1280, name
    assert " ".join(probe["question"]["text"].split()) == scored.questions[0]
    assert probe["reward"]["text"] == f"{scored.scores[0]['overall']:.2f}"
    assert probe["number"]["text"] == "0"
    assert not probe["metrics"]["visible"]  # collapsed below the episodes

    shot = tmp_path / "first_screen.png"  # what a user sees first (kept under pytest's tmp dir)
    _chromium("--run-all-compositor-stages-before-draw", f"--screenshot={shot}", scored.html.resolve().as_uri(),
              tmp_path=tmp_path)
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert pixels.shape[:2] == (800, 1280)
    assert pixels.std() > 20  # not a blank page
    print(f"first screen: {shot}")


def test_the_new_fields_are_escaped(grammar_rollout):
    saved = load_rollout(grammar_rollout.path)
    hostile = "<script>alert(1)</script>"
    saved.columns["ground_truth"] = [json.dumps({"answer": hostile, "doc_id": "<i>doc</i>", "gold_pages": [1]})
                                     ] * len(saved)
    saved.columns["termination_reason"][0] = "budget"
    saved.columns["budget_overflow"] = [{"turn": 1, "tokens": 9, "remaining": 2, "page_ids": [hostile]}] + [
        None] * (len(saved) - 1)
    page = render(saved)
    assert "<script>alert" not in page and "<i>doc" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;i&gt;doc&lt;/i&gt;_1" in page
