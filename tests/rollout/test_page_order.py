"""The pages an episode records are the pages it rendered, in the order it rendered them.

The recorded `page_ids` (one list per observation) are what the reward ranks (NDCG: earlier is
better) and what corpus scope reads its current document from (the document of the last page
shown, `core.scope`). Both must follow the observation as the policy saw it. The oracle here
reads the rendered tokens, not the recorded ids: each page image is a solid colour of its own
(its pad run is matched with the episode's image, whose colour names the page), each text page
says its id in brackets. Turns are any mix of searches, image and text fetches and crops, in
both action formats (tags: one call a turn; tool_call: several calls a turn, answered in one
tool turn) and both scopes, with image limits that leave pages out. Pure: the tiny compact
tokenizer and processor, a scripted policy, an in-memory retriever.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from vrag_rollout.core.episode import Episode
from vrag_rollout.devkit.demo import demo_config, demo_page_band
from vrag_rollout.retrieval.types import RetrievedPage, RetrieverFailure
from vrag_rollout.rollout.driver import EpisodeDriver
from vrag_rollout.rollout.schedules import ScheduleClock, run_episode
from vrag_rollout.turn_output import STOP, TurnOutput

DOCS = ("alpha", "beta", "deck_7")  # a doc id with an underscore: page ids split at the last one
PAGES = 4
LEVELS = (0, 127, 255)
COLOURS = dict(zip(((d, p) for d in DOCS for p in range(1, PAGES + 1)),
                   (c for c in itertools.product(LEVELS, repeat=3) if len(set(c)) > 1)))
MARK = re.compile(r"\[\[(\S+?)\]\]")


def png(colour: tuple, size: tuple = (224, 308)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return out.getvalue()


class ColouredPages:
    """An in-memory retriever: a search hits the pages its query names (`alpha_2 beta_1`), each
    page is a solid colour, a text page reads `[[<page id>]]`; a page past the document's last
    is refused as the asker's mistake, as the server refuses it."""

    def batch_search(self, queries, doc_ids, top_n):
        return [[self._image(*_split(pid)) for pid in query.split() if pid != "nothing"] for query in queries]

    def batch_fetch(self, specs, doc_ids):
        return [self._page(doc, spec.page, spec.modality) for spec, doc in zip(specs, doc_ids)]

    def batch_crop(self, doc_ids, pages, boxes, min_pixels, max_pixels, *, factor=28):
        out = []
        for doc, page, box in zip(doc_ids, pages, boxes):
            found = self._page(doc, page, "image")
            out.append(found if isinstance(found, RetrieverFailure) else RetrievedPage(
                found.page_id, doc, page, "image", png(COLOURS[doc, page], (112, 140)), region=tuple(box)))
        return out

    def _page(self, doc, page, modality):
        if page > PAGES:
            return RetrieverFailure("request", f"{doc} has {PAGES} pages")
        if modality == "text":
            return RetrievedPage(f"{doc}_{page}", doc, page, "text", f"[[{doc}_{page}]] the page's text")
        return self._image(doc, page)

    @staticmethod
    def _image(doc, page):
        return RetrievedPage(f"{doc}_{page}", doc, page, "image", png(COLOURS[doc, page]))


def _split(page_id: str) -> tuple[str, int]:
    doc, _, page = page_id.rpartition("_")
    return doc, int(page)


def page_of_colour(image) -> str:
    pixel = image.convert("RGB").getpixel((image.width // 2, image.height // 2))
    (doc, page), _ = min(COLOURS.items(), key=lambda item: sum((a - b) ** 2 for a, b in zip(item[1], pixel)))
    return f"{doc}_{page}"


# ---- the policy's calls, as each format writes them ----
def tags_turn(call) -> tuple[str, str]:
    kind, arg = call
    if kind == "search":
        return f"<search>{arg}</search>", "</search>"
    if kind == "crop":
        page, box = arg
        return (f"<bbox>{box}</bbox>", "</bbox>") if page is None else (f"<crop>{page}, {box}</crop>", "</crop>")
    return f"<fetch>{kind}, {arg}</fetch>", "</fetch>"


def tool_call(call) -> str:
    kind, arg = call
    if kind == "search":
        body = {"name": "search", "arguments": {"query": arg}}
    elif kind == "crop":
        page, box = arg
        body = {"name": "crop", "arguments": {"bbox": box, **({} if page is None else {"page": page})}}
    else:
        body = {"name": "fetch", "arguments": {"page": arg, "mode": kind}}
    return f"<tool_call>\n{json.dumps(body)}\n</tool_call>"


class ScriptedPolicy:
    """The turns of one episode, as the engine would return them; then the answer."""

    def __init__(self, tokenizer, action_format: str, turns: list[list[tuple]]):
        self.tokenizer, self.format = tokenizer, action_format
        self.turns = iter(turns)
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def __call__(self, request, params) -> TurnOutput:
        calls = next(self.turns, None)
        encode = lambda text: self.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
        if calls is None:
            text = "<answer>done</answer>"
            return TurnOutput(tuple(encode(text) + [self.end]), text, STOP, None)
        if self.format == "tags":
            (text, stop), = [tags_turn(call) for call in calls]
            return TurnOutput(tuple(encode(text)), text, STOP, stop)
        text = "<think>look</think>\n" + "\n".join(tool_call(call) for call in calls)
        return TurnOutput(tuple(encode(text) + [self.end]), text, STOP, None)


_drivers: dict = {}


def driver_for(model_dir, processor, action_format: str, max_images: int) -> EpisodeDriver:
    key = (action_format, max_images)
    if key not in _drivers:
        config = demo_config(**demo_page_band(processor), action_format=action_format, region_action=True,
                             action_regex=None, first_turn_action_regex=None, max_turns=12,
                             response_length=6000, prompt_length=1280, max_images_per_sample=max_images)
        _drivers[key] = EpisodeDriver(str(model_dir), config, processor.tokenizer, processor,
                                      retriever=ColouredPages())
    return _drivers[key]


def rendered_pages(episode: Episode, driver: EpisodeDriver) -> list[list[str]]:
    """Per observation (each run of observation tokens), the pages as its tokens show them."""
    vision = driver.vision_tokens
    images = iter(episode.images)
    out: list[list[str]] = []
    position, ids, mask = 0, episode.response_ids, episode.loss_mask
    while position < len(ids):
        if mask[position]:
            position += 1
            continue
        shown, text = [], []
        while position < len(ids) and not mask[position]:
            token = ids[position]
            if token == vision.vision_start and ids[position + 1] == vision.image_pad:
                shown += MARK.findall(driver.tokenizer.decode(text))
                text = []
                shown.append(page_of_colour(next(images).image))
                while ids[position + 1] == vision.image_pad:
                    position += 1
                position += 2  # the last pad, then vision_end
                continue
            text.append(token)
            position += 1
        out.append(shown + MARK.findall(driver.tokenizer.decode(text)))
    assert next(images, None) is None, "every image of the episode sits in an observation"
    return out


def run(driver: EpisodeDriver, action_format: str, doc_id, turns) -> Episode:
    tokenizer = driver.tokenizer
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Which page?"}], add_generation_prompt=True, tokenize=False,
        **({"tools": list(driver.format.template.tools)} if action_format == "tool_call" else {}))
    episode = Episode(index=0, prompt_engine_ids=tokenizer.encode(prompt, add_special_tokens=False),
                      prompt_images=[], doc_id=doc_id, response_length=driver.config.response_length,
                      max_images=driver.max_images)
    asyncio.run(run_episode(driver, episode, ScriptedPolicy(tokenizer, action_format, turns), ScheduleClock()))
    return episode


# ---- the calls: any mix ----
BOX = "[100, 150, 600, 700]"  # relative-1000, Qwen2-VL's grounding frame


@st.composite
def calls(draw, scope: str):
    page = st.integers(1, PAGES + 1)  # one past the last: the retriever refuses it
    hits = st.lists(st.tuples(st.sampled_from(DOCS) if scope == "corpus" else st.just(DOCS[0]),
                              st.integers(1, PAGES)), max_size=3)
    search = hits.map(lambda found: ("search", " ".join(f"{d}_{p}" for d, p in found) or "nothing"))
    fetch = st.tuples(st.sampled_from(["image", "text"]), page)
    crop = st.tuples(st.just("crop"), st.tuples(st.one_of(st.none(), page), st.just(BOX)))
    return draw(st.one_of(search, fetch, crop))


@pytest.mark.parametrize("action_format", ["tags", "tool_call"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), scope=st.sampled_from(["document", "corpus"]), max_images=st.sampled_from([3, 24]))
def test_recorded_pages_are_the_rendered_pages_in_rendered_order(tiny_model_dir, tiny_processor, action_format,
                                                                 data, scope, max_images):
    per_turn = 1 if action_format == "tags" else 4
    turns = data.draw(st.lists(st.lists(calls(scope), min_size=1, max_size=per_turn), min_size=1, max_size=5))
    driver = driver_for(tiny_model_dir, tiny_processor, action_format, max_images)
    episode = run(driver, action_format, DOCS[0] if scope == "document" else None, turns)
    assert [list(p) for p in episode.page_ids] == rendered_pages(episode, driver)


def test_a_corpus_fetch_after_a_text_fetch_reads_the_document_last_shown(tiny_model_dir, tiny_processor):
    """Issue 47, item 7: a tool turn that fetches a page's text, then searches, shows the search's
    pages last: the next fetch reads their document, and the turn ranks them after the text."""
    driver = driver_for(tiny_model_dir, tiny_processor, "tool_call", 24)
    turns = [[("search", "deck_7_1")],  # the current document: deck_7
             [("text", 2), ("search", "alpha_1 beta_3")],  # deck_7_2's text, then two pages
             [("image", 4)]]  # the current document is beta's now
    episode = run(driver, "tool_call", None, turns)
    assert episode.page_ids == [["deck_7_1"], ["deck_7_2", "alpha_1", "beta_3"], ["beta_4"]]
