"""The region action end to end, for every family and both action formats (`region_action=True`):
a real rollout (in both schedules) fetches page 2 of a PDF that holds a dark mark at a known place, then asks for the
box around the mark in the family's grounding frame (`<crop>2, [x1, y1, x2, y2]</crop>`, or the
`crop` tool's `{"page": 2, "bbox": [...]}`; 0..1000 for Qwen2-VL and Qwen3-VL, pixels of the page
as shown for Qwen2.5-VL), and the retriever renders the region from the PDF. Oracle: the mark's
centre, measured with numpy in the image the episode was shown, sits at the centre of the crop;
the same box read in the other frame (the wrong convention) does not show it there. The
project's `check` passes on the batches with crops, and the `image_regions` column names the box."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from PIL import Image
from reportlab.pdfgen import canvas

from tests.rollout.agent_helpers import make_agent
from vrag_rollout.core.pages import pixels
from vrag_rollout.core.regions import ABSOLUTE, RELATIVE_1000, Region, from_fractions
from vrag_rollout.core.vision import decode_page, decode_page_file
from vrag_rollout.data.prompts import PromptSample, build_prompts
from vrag_rollout.families import FAMILY_NAMES, family_by_name
from vrag_rollout.retrieval.client import FetchSpec, RetrieverClient
from vrag_rollout.verify.check import check_batch
from vrag_rollout.verify.saved_batch import from_dataproto

PAGE_W, PAGE_H = 612.0, 792.0
MARK = Region(0.62, 0.30, 0.68, 0.35)  # the mark on page 2, as fractions of the page
AROUND = Region(MARK.x1 - 0.06, MARK.y1 - 0.06, MARK.x2 + 0.06, MARK.y2 + 0.06)


def marked_pdf(path):
    c = canvas.Canvas(str(path), pagesize=(PAGE_W, PAGE_H), invariant=1)
    for page in (1, 2):
        c.drawString(72, 72, f"Inspection sheet, page {page}")
        if page == 2:
            x, y = MARK.x1 * PAGE_W, PAGE_H * (1 - MARK.y2)
            c.rect(x, y, (MARK.x2 - MARK.x1) * PAGE_W, (MARK.y2 - MARK.y1) * PAGE_H, stroke=0, fill=1)
        c.showPage()
    c.save()
    return path


@pytest.fixture(scope="module")
def retriever_url(tmp_path_factory):
    from retriever_server.api.testing import serve_in_thread
    from retriever_server.indexing.indexer import build_index

    tmp = tmp_path_factory.mktemp("regions")
    build_index([marked_pdf(tmp / "sheet.pdf")], tmp / "index", min_pixels=128 * 28 * 28, max_pixels=512 * 28 * 28,
                progress=False)
    with serve_in_thread(tmp / "index") as url:
        yield url


def mark_centre(image: Image.Image):
    dark = np.asarray(image.convert("L")) < 100
    ys, xs = np.nonzero(dark)
    if not len(xs):
        return None
    return (xs.mean() + 0.5) / image.width, (ys.mean() + 0.5) / image.height


def tool_call_regex(name, arguments):
    """One call as the chat template writes it (JSON as `json.dumps` spells it), then the turn ends."""
    return re.escape("<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>")


def roll(model, url, box, action_format="tags", rollout_mode="continuous"):
    box_text = ", ".join(map(str, box))
    if action_format == "tags":
        grammar = dict(first_turn_action_regex=re.escape("<fetch>image, 2</fetch>"),
                       action_regex=re.escape(f"<crop>2, [{box_text}]</crop>"), prompt_length=384, response_length=1536)
    else:
        grammar = dict(first_turn_action_regex=tool_call_regex("fetch", {"page": 2, "mode": "image"}),
                       action_regex=tool_call_regex("crop", {"page": 2, "bbox": list(box)}), prompt_length=1280,
                       response_length=768)  # prompt + response within 2048
    with RetrieverClient(url) as client:
        agent = make_agent(model.model_dir, model.processor, model.llm, client, n=1, max_turns=3, region_action=True,
                           action_format=action_format, rollout_mode=rollout_mode, **grammar)
        sample = PromptSample(question="What is marked on the inspection sheet?", doc_id="sheet")
        output = agent.generate_sequences(build_prompts([sample], tokenizer=model.processor.tokenizer,
                                                        processor=model.processor, config=agent.config))
    return agent, output


def shown_size(model, url):
    """The size page 2 is shown at in the episode: the retriever's page, decoded into the band."""
    with RetrieverClient(url) as client:
        agent = make_agent(model.model_dir, model.processor, model.llm, client, n=1)
        (page,) = client.batch_fetch([FetchSpec("image", 2)], ["sheet"])
    decode = decode_page_file if isinstance(page.contents, bytes) else decode_page
    return decode(page.contents, agent.driver.observer.band).image.size


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def family_rollouts(request, family_models, retriever_url):
    model = family_models(request.param)
    frame = family_by_name(request.param).grounding_frame
    size = shown_size(model, retriever_url)
    right = from_fractions(AROUND, frame, size)
    wrong_frame = RELATIVE_1000 if frame == ABSOLUTE else ABSOLUTE
    wrong = from_fractions(AROUND, wrong_frame, size)  # the box written in the other convention
    results = {}
    for name, box, action_format, mode in (("right", right, "tags", "continuous"), ("wrong", wrong, "tags", "continuous"),
                                           ("tool_call", right, "tool_call", "continuous"),
                                           ("right_sync", right, "tags", "sync"),
                                           ("tool_call_sync", right, "tool_call", "sync")):
        agent, output = roll(model, retriever_url, box, action_format, mode)
        results[name] = (agent, output, box)
    return model, frame, results


def crops(output):
    images = list(output.non_tensor_batch["multi_modal_data"][0].values())[0]
    return [pixels(image) for image in images[1:]]  # page 2 as fetched, then the crop(s)


@pytest.mark.parametrize("case", ["right", "tool_call", "right_sync", "tool_call_sync"])
def test_the_familys_box_shows_the_mark_centred(family_rollouts, case):
    model, frame, results = family_rollouts
    agent, output, box = results[case]
    assert output.meta_info["metrics"]["rollout/crops"] >= 1, output.non_tensor_batch["termination_reason"]
    (crop, *_) = crops(output)
    centre = mark_centre(crop)
    assert centre is not None and abs(centre[0] - 0.5) < 0.05 and abs(centre[1] - 0.5) < 0.05, (model.family, box,
                                                                                               centre)
    page = pixels(list(output.non_tensor_batch["multi_modal_data"][0].values())[0][0])
    assert crop.width * crop.height > 0.5 * page.width * page.height  # zoomed: far more pixels for the region
    report = check_batch(from_dataproto(output, processor=model.processor, model_path=model.model_dir,
                                        config=agent.config), model.model_dir)
    assert report.ok, report.human()
    regions = output.non_tensor_batch["image_regions"][0]
    assert regions[0] is None and regions[1] is not None  # the page as fetched, then its region
    # the box read back as page fractions: the region around the mark (the frame's rounding aside)
    assert all(abs(a - b) < 0.01 for a, b in zip(regions[1], (AROUND.x1, AROUND.y1, AROUND.x2, AROUND.y2)))


def test_a_box_in_the_other_frame_misses_the_mark(family_rollouts):
    model, frame, results = family_rollouts
    _, output, box = results["wrong"]
    shown = crops(output)
    centre = mark_centre(shown[0]) if shown else None
    assert centre is None or abs(centre[0] - 0.5) > 0.1 or abs(centre[1] - 0.5) > 0.1, (model.family, box, centre)


def test_check_catches_a_crop_result_in_the_loss_mask(family_rollouts):
    """Planted defect: the observation answering the crop put into the loss mask; the sampled
    run then goes on after `</crop>`, a stop of a region batch, and `check` says so."""
    model, _, results = family_rollouts
    agent, output, _ = results["right"]
    saved = from_dataproto(output, processor=model.processor, model_path=model.model_dir, config=agent.config)
    loss = saved.tensors["loss_mask"][0]
    used = int(saved.tensors["attention_mask"][0, saved.tensors["prompts"].shape[1]:].sum())
    flags = loss[:used].tolist()
    blocks = [i for i in range(1, used) if flags[i] == 0 and flags[i - 1] == 1]  # masked blocks' starts
    crop_block = blocks[1]  # the page as fetched, then the crop
    end = next((i for i in range(crop_block, used) if flags[i] == 1), used)
    loss[crop_block:end] = 1
    report = check_batch(saved, model.model_dir)
    assert any(f.check == "observations" and "</crop>" in f.message for f in report.failures), report.human()


def test_a_huge_integer_in_a_crop_box_is_an_invalid_action_of_the_batch(tiny_model_dir, tiny_processor, tiny_llm):
    """Issue 32, defect 4, on the real engine: a grammar makes the policy call `crop` with a box
    coordinate past the float range (2 * 10**308, 309 digits: ~330 tokens, so one turn fits the
    shared engine's context). The batch completes: the call counts as a `bad_region`, and the
    reward scores the responses (their format 0), where both raised OverflowError before."""
    from tests.conftest import SAMPLE_RETRIEVAL
    from vrag_rollout.core.reward import score_response
    from vrag_rollout.devkit.demo import demo_prompts
    from vrag_rollout.retrieval.fixtures import FixtureTransport

    call = tool_call_regex("crop", {"bbox": [0, 0, 2 * 10**308, 500]})
    client = RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL))
    agent = make_agent(tiny_model_dir, tiny_processor, tiny_llm, client, n=1, max_turns=1, region_action=True,
                       action_format="tool_call", prompt_length=1280, response_length=768, action_regex=call)
    samples = [PromptSample(question="What is on page 1?", doc_id="annual_report")] * 2
    output = agent.generate_sequences(demo_prompts(tiny_processor.tokenizer, tiny_processor, samples, agent.config))
    metrics, tok = output.meta_info["metrics"], tiny_processor.tokenizer
    assert list(output.non_tensor_batch["termination_reason"]) == ["max_turns"] * len(output)
    assert metrics["rollout/invalid_actions/bad_region"] == metrics["rollout/invalid_actions"] == len(output)
    assert metrics["rollout/crops"] == 0
    for row in range(len(output)):
        used = output.batch["response_mask"][row].bool()
        text = tok.decode(output.batch["responses"][row][used].tolist(), skip_special_tokens=False)
        assert "0" * 308 in text  # the policy did write the huge coordinate
        assert score_response(text, "x")["format"] == 0.0
