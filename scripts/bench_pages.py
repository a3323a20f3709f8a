"""Pages once: what a rollout batch's pages cost in memory, on the wire and in the trainer, against
the bound of one copy per distinct page, measured side by side with what main held before.

The rollout is real: vLLM with the tiny Qwen2-VL, the demo's questions and grammar (a search or a
fetch every turn, up to --max-turns), recorded retrieval (tests/fixtures/sample_retrieval.json),
for each of --sizes (prompts x n). Each batch is then read at two page sizes:
- `demo`: the pages as the rollout showed them (the demo band, 16-64 visual tokens);
- `real`: the same episodes with each distinct page swapped for a real-size page (784x1008 px,
  1,008 visual tokens: a page of the sample corpus rendered with pypdfium2, JPEG quality 85), a
  page shared by many samples staying shared. A tiny model cannot roll out 1,008-token pages at
  this scale on a CPU; what is measured here (the batch, its pickling, the trainer's image
  inputs) does not depend on who sampled the tokens.

Printed per size and page size:
- image references (retrieved pages over all samples and turns) and distinct pages;
- pickled bytes of the batch (the whole DataProto, as Ray sends it) and of its image column, and
  the column's ratio to the distinct pages' encoded bytes (the bound); beside it, the column as
  main held it, one decoded RGB image per reference (pickled size measured on --before-refs
  references and scaled: each reference pickles on its own);
- trainer side (EasyR1's worker path, `integrations.easyr1.images.build_multi_modal_inputs` on
  the unpickled column, as a worker receives it): image-processor calls, its CPU time (decoding
  included), the `pixel_values` bytes held (one per distinct page) and the largest micro-batch's
  (--micro-batch samples, concatenated as EasyR1's actor does), against main's per-sample
  `pixel_values` (exact sizes from the grids) and per-reference processor CPU (the measured mean
  per page times the references).

Goals (issue 36) at 32x8, real-size: pickled image column within 1.5x of the distinct pages'
bytes; pixel_values held at most one micro-batch plus one copy per distinct page; processor calls
equal to distinct pages.

Second part, CPU per turn at growing concurrency (--trajectories, 8 samples a prompt): the
rollout's own work (turn loop, retrieval replay, page decoding, observations, batch assembly)
with real-size pages served at their band size (the recorded answers' pages swapped for
real-size JPEGs; the band 256-1,008 visual tokens), every turn fetching a page until the
4,608-token budget is spent (4 pages a trajectory). The model's sampling is scripted
(`devkit.scripted_sampler`), so nothing but the rollout's CPU is measured. Each size runs twice
in one process, side by side: pages once, and one decode per page reference (the page cache
disabled: what main did, a fresh decoded page for every sample and turn). Printed per run: user
and system CPU per turn (all threads, `getrusage`), minor page faults per turn, and the batch
assembly's time.

    .venv/bin/python scripts/bench_pages.py [--sizes 4x2,8x4,16x8,32x8] [--micro-batch 4]
        [--trajectories 32,128,512] [--parts batch,concurrency]
"""

from __future__ import annotations

import argparse
import io
import pickle
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FIXTURES = REPO / "tests" / "fixtures" / "sample_retrieval.json"
REAL_SIZE = (784, 1008)  # (width, height): 28 x 36 merged patches, 1,008 visual tokens
GOAL_COLUMN_RATIO = 1.5


def real_pages() -> list[bytes]:
    """Every page of the sample corpus rendered at the real page size, as JPEG."""
    import pypdfium2

    from retriever_server.sample_corpus import write_sample_corpus

    pages = []
    with tempfile.TemporaryDirectory() as folder:
        for pdf_path in write_sample_corpus(folder):
            pdf = pypdfium2.PdfDocument(str(pdf_path))
            for page in pdf:
                image = page.render(scale=REAL_SIZE[0] / page.get_width()).to_pil().convert("RGB")
                buffer = io.BytesIO()
                image.resize(REAL_SIZE).save(buffer, format="JPEG", quality=85)
                pages.append(buffer.getvalue())
            pdf.close()
    return pages


def rollout(model_dir: Path, processor: Any, llm: Any, prompts: int, n: int, max_turns: int) -> tuple[Any, Any]:
    """(the rollout's batch, its engine: the next size reuses it)."""
    from vrag_rollout.devkit.demo import demo_config, demo_page_band, demo_prompts, demo_questions
    from vrag_rollout.rollout.agent import vLLMRolloutAgent

    config = demo_config(**demo_page_band(processor), retriever_fixtures=str(FIXTURES), n=n, max_turns=max_turns)
    agent = vLLMRolloutAgent(str(model_dir), config, processor.tokenizer, processor, inference_engine=llm)
    questions = (demo_questions() * prompts)[:prompts]
    batch = agent.generate_sequences(demo_prompts(processor.tokenizer, processor, questions, config))
    return batch, agent.inference_engine


def retrieved(column: Any) -> list[list[Any]]:
    from vrag_rollout.core.pages import PageEntry

    return [[image for image in row["images"] if isinstance(image, PageEntry)] for row in column]


def swapped(column: Any, pages: list[bytes]) -> np.ndarray:
    """The column with each distinct page replaced by a real-size one (shared stays shared)."""
    from vrag_rollout.core.pages import PageEntry

    by_key: dict[str, PageEntry] = {}
    rows = []
    for row in column:
        images = []
        for image in row["images"]:
            if isinstance(image, PageEntry):
                if image.key not in by_key:
                    by_key[image.key] = PageEntry(pages[len(by_key) % len(pages)])
                image = by_key[image.key]
            images.append(image)
        rows.append({"images": images})
    out = np.empty(len(rows), dtype=object)
    out[:] = rows
    return out


def process_image(image: Any, min_pixels: Any, max_pixels: Any) -> Any:
    """EasyR1's `process_image` for these entries: the page's pixels, already in the band."""
    from vrag_rollout.core.pages import pixels

    return pixels(image)


class CountingProcessor:
    def __init__(self, processor: Any):
        self.image_processor = self
        self.inner = processor.image_processor
        self.calls = 0
        self.seconds: list[float] = []

    def __call__(self, images: Any = None, **kwargs: Any) -> Any:
        self.calls += 1
        start = time.process_time()
        out = self.inner(images=images, **kwargs)
        self.seconds.append(time.process_time() - start)
        return out


def trainer_side(column: np.ndarray, processor: Any, micro_batch: int) -> dict:
    """EasyR1's worker path on the column as a worker receives it (unpickled)."""
    from vrag_rollout.integrations.easyr1.images import build_multi_modal_inputs, sample_cache_keys

    received = pickle.loads(pickle.dumps(column, protocol=pickle.HIGHEST_PROTOCOL))
    counting = CountingProcessor(processor)
    start = time.process_time()
    keys = sample_cache_keys(received)
    inputs = build_multi_modal_inputs(received, keys, counting, process_image, None, None, None, 2.0)
    cpu = time.process_time() - start
    parts = {}
    for sample in inputs:
        for part in getattr(sample, "parts", ()):
            parts[id(part)] = part
    held = sum(part["pixel_values"].nbytes for part in parts.values())
    peak = 0
    for first in range(0, len(inputs), micro_batch):
        micro = [dict(sample.items()) for sample in inputs[first:first + micro_batch] if len(sample)]
        if micro:
            peak = max(peak, sum(x["pixel_values"].nbytes for x in micro))
    return {"calls": counting.calls, "cpu": cpu, "held": held, "peak": peak,
            "processor_mean_s": float(np.mean(counting.seconds)) if counting.seconds else 0.0}


def before_pickled_bytes(column: np.ndarray, refs: int, sample_refs: int) -> float:
    """main's column: one decoded RGB image per reference (a fresh object each time)."""
    taken = [entry for row in retrieved(column) for entry in row][:sample_refs]
    copies = [entry.image.copy() for entry in taken]
    return len(pickle.dumps(copies, protocol=pickle.HIGHEST_PROTOCOL)) / max(len(copies), 1) * refs


def pixel_values_bytes(entry: Any, processor: Any) -> int:
    """float32 `pixel_values` of one page, from its size alone: (H/p)(W/p) patches of
    3 x temporal x p x p values (the bound for one copy of the page)."""
    ip = processor.image_processor
    patch, temporal = int(ip.patch_size), int(ip.temporal_patch_size)
    width, height = entry.size
    return (height // patch) * (width // patch) * 3 * temporal * patch * patch * 4


def report(label: str, batch: Any, column: np.ndarray, processor: Any, args: Any) -> dict:
    rows = retrieved(column)
    refs = sum(len(row) for row in rows)
    distinct = {entry.key: entry for row in rows for entry in row}
    encoded = sum(len(entry["bytes"]) for entry in distinct.values())
    column_bytes = len(pickle.dumps(column, protocol=pickle.HIGHEST_PROTOCOL))
    original = batch.non_tensor_batch["multi_modal_data"]
    batch.non_tensor_batch["multi_modal_data"] = column
    try:
        batch_bytes = len(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))
    finally:
        batch.non_tensor_batch["multi_modal_data"] = original
    before_column = before_pickled_bytes(column, refs, args.before_refs)
    trainer = trainer_side(column, processor, args.micro_batch)
    # main: every sample's pixel_values, one copy per reference; the processor run per reference
    before_held = sum(pixel_values_bytes(entry, processor) for row in rows for entry in row)
    before_cpu = trainer["processor_mean_s"] * refs
    mb = 1e6
    print(f"  {label:<6} refs {refs:5d}  distinct {len(distinct):3d}  encoded {encoded / mb:8.2f} MB | "
          f"pickled batch {batch_bytes / mb:8.2f} MB, image column {column_bytes / mb:8.2f} MB "
          f"= {column_bytes / encoded:5.2f}x bound (main: {before_column / mb:9.1f} MB, "
          f"{before_column / column_bytes:6.1f}x this)")
    print(f"  {'':<6} trainer: processor calls {trainer['calls']:4d} (distinct {len(distinct)}), "
          f"CPU {trainer['cpu']:6.2f} s (main: ~{before_cpu:7.1f} s); pixel_values held "
          f"{trainer['held'] / mb:8.1f} MB + micro-batch peak {trainer['peak'] / mb:7.1f} MB "
          f"(main: {before_held / mb:9.1f} MB, {before_held / max(trainer['held'] + trainer['peak'], 1):6.1f}x)")
    return {"refs": refs, "distinct": len(distinct), "column_ratio": column_bytes / encoded,
            "calls": trainer["calls"], "held": trainer["held"], "peak": trainer["peak"],
            "bound_pixels": sum(pixel_values_bytes(entry, processor) for entry in distinct.values())}


class NoSharing:
    """A page cache that never finds a page: one decode per reference, as main decoded."""

    hits = misses = 0

    def get(self, key: Any, decode: Any) -> Any:
        self.misses += 1
        return decode()


def real_size_fixture(pages: list[bytes], folder: Path) -> Path:
    """The recorded retrieval with each recorded page image swapped for a real-size one."""
    import base64
    import json

    data = json.loads(FIXTURES.read_text())
    data["blobs"] = {key: base64.b64encode(pages[k % len(pages)]).decode()
                     for k, key in enumerate(sorted(data["blobs"]))}
    path = folder / "real_size_retrieval.json"
    path.write_text(json.dumps(data))
    return path


def concurrency_run(model_dir: Path, processor: Any, fixture: Path, trajectories: int, share: bool) -> dict:
    import resource

    from vrag_rollout.devkit.demo import demo_config, demo_prompts, demo_questions
    from vrag_rollout.devkit.scripted_sampler import ScriptedSampler
    from vrag_rollout.rollout.agent import vLLMRolloutAgent

    width, height = REAL_SIZE
    config = demo_config(retriever_fixtures=str(fixture), n=8, rollout_mode="sync", response_length=4608,
                         max_turns=6, max_images_per_sample=6, page_min_pixels=256 * 28 * 28,
                         page_max_pixels=width * height)
    agent = vLLMRolloutAgent(str(model_dir), config, processor.tokenizer, processor, inference_engine=object())
    agent.engine = ScriptedSampler(processor.tokenizer, 16)
    if not share:
        agent.driver.observer.pages = NoSharing()
    assemble, assembly = agent.driver.assemble, []

    def timed_assemble(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return assemble(*args, **kwargs)
        finally:
            assembly.append(time.perf_counter() - start)

    agent.driver.assemble = timed_assemble
    questions = (demo_questions() * trajectories)[:trajectories // 8]
    prompts = demo_prompts(processor.tokenizer, processor, questions, config)
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    batch = agent.generate_sequences(prompts)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    turns = int(sum(batch.non_tensor_batch["num_turns"]))
    return {"turns": turns, "wall": wall, "user": (after.ru_utime - before.ru_utime) / turns,
            "sys": (after.ru_stime - before.ru_stime) / turns,
            "faults": (after.ru_minflt - before.ru_minflt) / turns, "assembly": assembly[-1],
            "refs": sum(len(retrieved_row) for retrieved_row in retrieved(batch.non_tensor_batch["multi_modal_data"]))}


def concurrency_part(model_dir: Path, processor: Any, pages: list[bytes], sizes: list[int]) -> None:
    print("\nCPU per turn, real-size pages, scripted sampling (rollout CPU only):")
    print(f"  {'trajectories':>12} {'pages':<13} {'turns':>6} {'refs':>6} {'user ms/turn':>13} {'sys ms/turn':>12} "
          f"{'faults/turn':>12} {'assembly s':>11} {'wall s':>7}")
    results: dict = {}
    with tempfile.TemporaryDirectory() as folder:
        fixture = real_size_fixture(pages, Path(folder))
        concurrency_run(model_dir, processor, fixture, 8, True)  # warm-up: first-use costs, not measured
        for trajectories in sizes:
            for share in (True, False):
                run = results[(trajectories, share)] = concurrency_run(model_dir, processor, fixture, trajectories, share)
                label = "once" if share else "per reference"
                print(f"  {trajectories:>12} {label:<13} {run['turns']:>6} {run['refs']:>6} {run['user'] * 1e3:>13.2f} "
                      f"{run['sys'] * 1e3:>12.2f} {run['faults']:>12.0f} {run['assembly']:>11.3f} {run['wall']:>7.1f}")
    low, high = sizes[0], sizes[-1]
    for share, label in ((True, "pages once"), (False, "per reference")):
        a, b = results[(low, share)], results[(high, share)]
        print(f"  {label}: CPU per turn at {high} / at {low} trajectories: user {b['user'] / a['user']:.2f}x, "
              f"system {b['sys'] / max(a['sys'], 1e-9):.2f}x; assembly {b['assembly'] / a['assembly']:.1f}x "
              f"for {high / low:.0f}x the trajectories")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4x2,8x4,16x8,32x8", help="prompts x n, comma separated")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=4, help="samples per actor micro-batch")
    parser.add_argument("--before-refs", type=int, default=64,
                        help="references whose per-reference pickling is measured for main's column")
    parser.add_argument("--trajectories", default="32,128,512", help="concurrency part: trajectories per run")
    parser.add_argument("--parts", default="batch,concurrency")
    args = parser.parse_args()
    sizes = [tuple(int(x) for x in size.split("x")) for size in args.sizes.split(",")]
    parts = args.parts.split(",")

    from transformers import AutoProcessor

    from vrag_rollout.devkit.demo import demo_model
    from vrag_rollout.engine.llm import configure_cpu_defaults

    configure_cpu_defaults()
    model_dir, _ = demo_model("qwen2-vl")
    processor = AutoProcessor.from_pretrained(model_dir)
    pages = real_pages()
    if "batch" in parts:
        batch_part(model_dir, processor, pages, sizes, args)
    if "concurrency" in parts:
        concurrency_part(model_dir, processor, pages, [int(x) for x in args.trajectories.split(",")])


def batch_part(model_dir: Path, processor: Any, pages: list[bytes], sizes: list, args: Any) -> None:
    llm = None
    results = {}
    for prompts, n in sizes:
        start = time.perf_counter()
        batch, llm = rollout(model_dir, processor, llm, prompts, n, args.max_turns)
        print(f"{prompts}x{n}: {len(batch)} samples, rollout {time.perf_counter() - start:.1f} s")
        column = batch.non_tensor_batch["multi_modal_data"]
        results[(prompts, n, "demo")] = report("demo", batch, column, processor, args)
        results[(prompts, n, "real")] = report("real", batch, swapped(column, pages), processor, args)
    prompts, n = sizes[-1]
    real = results[(prompts, n, "real")]
    print(f"\ngoals at {prompts}x{n}, real-size pages:")
    print(f"  pickled image column / distinct pages' bytes: {real['column_ratio']:.2f}x "
          f"(goal <= {GOAL_COLUMN_RATIO}x): {'met' if real['column_ratio'] <= GOAL_COLUMN_RATIO else 'MISSED'}")
    ok = real["held"] <= real["bound_pixels"]  # the micro-batch is stacked on read and let go
    print(f"  pixel_values held across the step: {real['held'] / 1e6:.1f} MB, one copy per distinct page "
          f"{real['bound_pixels'] / 1e6:.1f} MB (plus, while it computes, one micro-batch: {real['peak'] / 1e6:.1f} MB): "
          f"{'met' if ok else 'MISSED'}")
    print(f"  processor calls {real['calls']} = distinct pages {real['distinct']}: "
          f"{'met' if real['calls'] == real['distinct'] else 'MISSED'}")


if __name__ == "__main__":
    main()
