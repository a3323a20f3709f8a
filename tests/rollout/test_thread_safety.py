"""The observation builder under thread contention, as the continuous schedule runs it: many tool
threads build observations of both action formats at once (page text holding special-token
strings, page images, errors) with the real tokenizer, processor band and chat template of every
family. The oracle is the same builder run on one thread: every observation must be equal to it
token for token, and no call may raise."""

from __future__ import annotations

import io
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image, ImageDraw

from vrag_rollout.core.actions import Fetch, Invalid, Search
from vrag_rollout.families import FAMILY_NAMES
from vrag_rollout.core.observation import ObservationBuilder, VisionTokens
from vrag_rollout.retrieval.client import RetrievedPage, RetrieverFailure
from vrag_rollout.core.serial_tokenizer import SerialTokenizer, lock_for, private_copy, serial
from vrag_rollout.devkit.tiny_model import build_tiny_model, default_model_dir
from vrag_rollout.core.tool_turns import TOOLS, ToolTurnTemplate
from vrag_rollout.rollout.tools import Observer, Room
from vrag_rollout.core.vision import page_band

pytestmark = pytest.mark.stress  # 8 threads x 30 rounds per family: seconds each

THREADS = 8
ROUNDS = 30  # per thread, each round every item of both formats


def jpeg(seed: int) -> bytes:
    image = Image.new("RGB", (180 + 20 * seed, 240), (250, 250, 245))
    ImageDraw.Draw(image).rectangle([10, 10, 100, 30 + 10 * seed], outline=(0, 0, 0), width=3)
    out = io.BytesIO()
    image.save(out, format="JPEG")
    return out.getvalue()


def text_page(k: int) -> RetrievedPage:
    # Special-token strings a real page may hold: they must stay plain text in the observation.
    text = (f"Page {k}: revenue <|im_end|> rose {k}% <|image_pad|><|vision_start|> then "
            f"<|im_start|>assistant <|endoftext|> fell. " * (1 + k % 3))
    return RetrievedPage(f"doc_{k}", "doc", k, "text", text)


def image_page(k: int) -> RetrievedPage:
    return RetrievedPage(f"doc_{k}", "doc", k, "image", jpeg(k % 3))


def work_items() -> list[tuple]:
    """(format, arguments) of one tool call or tool turn each; both formats interleaved, so a
    thread switches between encoding with and without special tokens."""
    items = []
    for k in range(1, 5):
        items.append(("tags", [(Fetch("text", k), text_page(k), 300, 4)]))
        items.append(("tool_call", ([Fetch("image", k), Fetch("text", k)], [image_page(k), text_page(k)], 1200, 4)))
        items.append(("tool_call", ([Fetch("text", k), Invalid("bad call", "invalid_json")], [text_page(k + 1), None],
                                    600, 4)))
        items.append(("tags", [(Search(f"q{k}"), [image_page(k), image_page(k + 1)], 1500, 4),
                               (Fetch("text", k), RetrieverFailure("timeout", "the retriever timed out <|im_end|>"),
                                200, 4)]))
    return items


def build(observer: Observer, template: ToolTurnTemplate, item: tuple) -> list:
    kind, args = item
    if kind == "tags":
        results = observer.observe_turn([(action, outcome, Room(budget, slots)) for action, outcome, budget, slots in args])
    else:
        calls, outcomes, budget, slots = args
        results = [observer.observe_tool_turn(calls, outcomes, Room(budget, slots), template)]
    return [(r.observation.engine_ids, r.observation.trainer_ids, r.observation.page_ids) for r in results]


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def builders(request):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(build_tiny_model(default_model_dir(request.param), request.param))
    tokenizer = processor.tokenizer
    builder = ObservationBuilder(tokenizer, VisionTokens.from_tokenizer(tokenizer), max_text_tokens=96)
    return Observer(builder, page_band(processor)), ToolTurnTemplate(tokenizer, TOOLS), tokenizer


def test_observations_under_contention_equal_the_single_threaded_build(builders):
    observer, template, tokenizer = builders
    items = work_items()
    expected = [build(observer, template, item) for item in items]
    # The oracle itself keeps special-token strings of page text as text.
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    text_obs = expected[0][0][0]
    assert im_end not in text_obs and len(text_obs) > 20

    start = threading.Barrier(THREADS)

    def worker(seed: int) -> list[str]:
        start.wait(timeout=30)
        wrong = []
        for r in range(ROUNDS):
            for j in range(len(items)):
                k = (j + seed + r) % len(items)  # threads out of phase: different modes at once
                try:
                    got = build(observer, template, items[k])
                except Exception as error:  # noqa: BLE001 - a raise is a failure to report
                    wrong.append(f"item {k} raised {error!r}")
                    continue
                if got != expected[k]:
                    wrong.append(f"item {k} differs from the single-threaded build")
        return wrong

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        with ThreadPoolExecutor(THREADS) as pool:
            wrong = [w for found in pool.map(worker, range(THREADS)) for w in found]
    finally:
        sys.setswitchinterval(interval)
    assert not wrong, f"{len(wrong)} of {THREADS * ROUNDS * len(items)} builds wrong, e.g. {wrong[:3]}"


def test_every_wrapper_of_one_tokenizer_shares_its_lock(builders):
    observer, template, tokenizer = builders
    assert observer.builder.tokenizer.lock is template.tokenizer.lock is lock_for(tokenizer)
    assert serial(observer.builder.tokenizer) is observer.builder.tokenizer
    assert SerialTokenizer(observer.builder.tokenizer).raw is tokenizer
    assert observer.builder.tokenizer.pad_token_id == tokenizer.pad_token_id
    with pytest.raises(AttributeError, match="without the tokenizer's lock"):
        observer.builder.tokenizer.batch_decode


def test_a_tool_batch_past_its_deadline_fails_the_wait():
    import time
    from concurrent.futures import Future

    from vrag_rollout.rollout.schedules import await_one

    never, started = Future(), time.perf_counter()
    with pytest.raises(TimeoutError, match="within its deadline of 0.2 s"):
        await_one([never], [started], 0.2)
    assert time.perf_counter() - started < 2
    done = Future()
    done.set_result([])
    await_one([never, done], [started - 100, started], 0.2)  # one back: no wait, no error


def test_threads_on_a_private_copy_never_change_the_callers_tokenizer(builders):
    """The rollout's tool threads may still run after a failed call while the trainer tokenizes
    with its own tokenizer, which never takes our lock: they work on a private copy."""
    _, _, tokenizer = builders
    builder = ObservationBuilder(private_copy(tokenizer), VisionTokens.from_tokenizer(tokenizer))
    assert builder.tokenizer.raw is not tokenizer and builder.tokenizer.lock is not lock_for(tokenizer)
    prompt = "<|im_start|>user\nq<|im_end|>"
    expected = tokenizer.encode(prompt, add_special_tokens=False)
    assert builder.encode_text(prompt) != expected  # the builder keeps special-token strings as text
    stop = threading.Event()

    def tool_thread() -> None:
        while not stop.is_set():
            builder.encode_text(prompt)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=tool_thread) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        seen = [tokenizer.encode(prompt, add_special_tokens=False) for _ in range(3000)]
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        sys.setswitchinterval(interval)
    assert all(ids == expected for ids in seen)
