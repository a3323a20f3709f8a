"""Encoder throughput: pipelined page preprocessing and batched query encoding, as ratios.

Pages (one ``encode_images`` call over all pages):
  model alone    inputs prepared beforehand, only the model step timed (the ceiling)
  serial         today's path: prepare a batch in the calling thread, embed it, next batch
  pipelined      preparation in worker processes, overlapped with the model
Queries: N threads each ask for one query at the same moment:
  today          each caller encodes its query alone, under the model lock
  batched        the collector gathers the callers into shared model calls

Modes:
  default            the tiny ColQwen2 checkpoint twice. First with the model SIMULATED as a
                     GPU: its forward is a fixed wait that holds no GIL and no CPU (as a CUDA
                     kernel wait) and returns zeros of the real shape; per page 1.5x the measured
                     preparation cost, per query call the H200 figures (19 ms + 0.68 ms a further
                     query). Everything else is real: JPEG decode, processor, worker processes,
                     transfers, collector, un-padding. Then as it is: the real tiny model on this
                     CPU, nothing simulated (torch given the cores the workers leave).
  --released-shapes  a random-weight ColQwen2 with Qwen2-VL-2B's shapes (bf16, on the GPU),
                     pages up to 768 visual tokens: no simulation (needs a GPU machine).

    python scripts/bench_encoder.py [--pages 96] [--batch 4] [--workers N] [--callers 64]
    python scripts/bench_encoder.py --released-shapes --pages 256   # on a GPU machine
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retriever_server.encoders.colqwen2 import ColQwen2Encoder, prepare_images  # noqa: E402

# Measured on an H200 with ColQwen2 at Qwen2-VL-2B's shapes (bf16): one query 19 ms, 64 in one
# call 62 ms. The simulated query cost is these two points' line.
H200_QUERY_CALL_S, H200_QUERY_EXTRA_S = 0.019, (0.062 - 0.019) / 63
SIM_PAGE_FACTOR = 1.5  # simulated model time a page, relative to the preparation time a page
RELEASED_MAX_TOKENS = 768


class BenchEncoder(ColQwen2Encoder):
    """ColQwen2Encoder whose forward can be SIMULATED: a fixed GIL-free wait, no CPU work.

    A GPU forward costs the host a kernel wait, not CPU time or the GIL; ``time.sleep`` behaves
    the same. The simulated forward returns zero embeddings of the real shape, so everything
    around it (processor, workers, transfers, collector, un-padding) runs for real.
    """

    simulate = False
    page_cost_s = 0.0  # simulated model time a page
    call_cost_s = 0.0  # simulated model time of a query call with one query ...
    query_cost_s = 0.0  # ... and for each further query in the call

    def _run_model(self, inputs):
        import torch

        if not self.simulate:
            out = super()._run_model(inputs)
            if out.is_cuda:
                torch.cuda.synchronize()
            return out
        n, tokens = inputs["input_ids"].shape
        if "pixel_values" in inputs:
            time.sleep(self.page_cost_s * n)
        else:
            time.sleep(self.call_cost_s + self.query_cost_s * (n - 1))
        return torch.zeros(n, tokens, self.dim)


def letter_pages(n: int, dpi: int = 150) -> list[bytes]:
    """Letter-size pages with lines of text-like strokes, as JPEG (distinct pages)."""
    from PIL import Image, ImageDraw

    width, height = int(8.5 * dpi), 11 * dpi
    pages = []
    for i in range(n):
        image = Image.new("RGB", (width, height), "white")
        draw = ImageDraw.Draw(image)
        for line in range(40):
            y = 80 + line * (height - 160) // 40
            draw.text((70, y), f"page {i} line {line} " + "lorem ipsum dolor sit amet " * 3,
                      fill=(20, 20, 20))
        draw.rectangle((70 + 7 * i % 300, 300, 500 + 7 * i % 300, 420), fill=(60, 90, 160))
        out = io.BytesIO()
        image.save(out, "JPEG", quality=85)
        pages.append(out.getvalue())
    return pages


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def page_rates(enc: BenchEncoder, jpegs: list[bytes], repeat: int) -> dict:
    batches = [jpegs[i:i + enc.batch_size] for i in range(0, len(jpegs), enc.batch_size)]
    prepared = [prepare_images(enc.processor, b) for b in batches]

    def model_alone():
        for inputs in prepared:
            enc._embed(inputs)

    n = len(jpegs)
    rates = {"model alone": n / best(model_alone, repeat),
             "serial (today)": n / best(lambda: enc.encode_images_serial(jpegs), repeat),
             "pipelined": n / best(lambda: enc.encode_images(jpegs), repeat)}
    return rates


def query_rates(enc: BenchEncoder, callers: int, repeat: int) -> dict:
    queries = [f"what does page {i} say about the plotting terminal" for i in range(callers)]

    def concurrently(encode_one) -> float:
        """Seconds from releasing the callers (threads already started, as a server's) to the
        last answer."""
        gate = threading.Barrier(callers + 1)
        errors = []

        def call(q):
            gate.wait(timeout=60)
            try:
                encode_one(q)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=call, args=(q,)) for q in queries]
        for t in threads:
            t.start()
        gate.wait(timeout=60)
        started = time.perf_counter()
        for t in threads:
            t.join(timeout=600)
        elapsed = time.perf_counter() - started
        if errors or any(t.is_alive() for t in threads):
            raise RuntimeError(f"query callers failed: {errors[:1]}")
        return elapsed

    today = min(concurrently(lambda q: enc._encode_queries_now([q])) for _ in range(repeat))
    calls = enc._batcher.calls
    batched = min(concurrently(lambda q: enc.encode_queries([q])) for _ in range(repeat))
    return {"today": callers / today, "batched": callers / batched,
            "model calls per round": (enc._batcher.calls - calls) / repeat}


def prep_cost_s(enc: BenchEncoder, jpegs: list[bytes]) -> float:
    sample = jpegs[:8]
    return best(lambda: [prepare_images(enc.processor, [j]) for j in sample], 2) / len(sample)


def report(title: str, pages: dict, queries: dict, callers: int) -> None:
    print(f"\n== {title}")
    for key in ("model alone", "serial (today)", "pipelined"):
        print(f"  pages/s {key:<15} {pages[key]:8.1f}")
    print(f"  pipelined / model alone      {pages['pipelined'] / pages['model alone']:6.1%}"
          f"   (serial / model alone {pages['serial (today)'] / pages['model alone']:.1%})")
    print(f"  queries/s, {callers} concurrent single-query callers:"
          f" today {queries['today']:.1f}, batched {queries['batched']:.1f}"
          f" ({queries['model calls per round']:.1f} model calls a round)")
    print(f"  batched / today              {queries['batched'] / queries['today']:6.1f}x")


def released_checkpoint(out_dir: Path) -> Path:
    """A random-weight ColQwen2 with Qwen2-VL-2B's shapes (bf16), the tiny byte-level tokenizer."""
    import torch
    from transformers import (ColQwen2Config, ColQwen2ForRetrieval, ColQwen2Processor,
                              Qwen2VLConfig, Qwen2VLImageProcessor)

    from retriever_server.encoders.tiny import SPECIAL_TOKENS, _tokenizer

    if (out_dir / "config.json").is_file():
        return out_dir
    tok = _tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    vlm = Qwen2VLConfig(
        text_config=dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         max_position_embeddings=32768, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                          "mrope_section": [16, 24, 24]},
                         bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                         pad_token_id=ids["<|endoftext|>"]),
        vision_config=dict(depth=32, embed_dim=1280, hidden_size=1536, num_heads=16,
                           mlp_ratio=4, in_channels=3, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    torch.manual_seed(0)
    model = ColQwen2ForRetrieval(ColQwen2Config(vlm_config=vlm, embedding_dim=128))
    model.to(torch.bfloat16).save_pretrained(out_dir)
    image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": 4 * 28 * 28, "longest_edge": RELEASED_MAX_TOKENS * 28 * 28},
        patch_size=14, temporal_patch_size=2, merge_size=2)
    ColQwen2Processor(image_processor=image_processor, tokenizer=tok).save_pretrained(out_dir)
    return out_dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pages", type=int, default=96)
    ap.add_argument("--batch", type=int, default=4, help="pages per model call")
    ap.add_argument("--workers", type=int, default=None,
                    help="preprocessing processes (default: the encoder's, min(cpus-1, 8))")
    ap.add_argument("--callers", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2, help="best of this many runs a figure")
    ap.add_argument("--released-shapes", action="store_true")
    ap.add_argument("--work", type=Path, default=None, help="where checkpoints are built")
    args = ap.parse_args()

    work = args.work or Path(tempfile.gettempdir()) / "vrag-bench-encoder"
    jpegs = letter_pages(args.pages)
    print(f"machine: {os.cpu_count()} CPUs; {args.pages} letter-size pages "
          f"({sum(map(len, jpegs)) // len(jpegs) // 1024} KB JPEG each), batch {args.batch}, "
          f"{args.callers} query callers, best of {args.repeat}")

    if args.released_shapes:
        path = released_checkpoint(work / "released-shapes")
        runs = [("released shapes (random weights, bf16), nothing simulated", False)]
    else:
        from retriever_server.encoders.tiny import build_tiny_colqwen2

        path = build_tiny_colqwen2(work / "tiny-colqwen2")
        runs = [("tiny ColQwen2, model SIMULATED as a GPU (GIL-free wait), all else real", True),
                ("tiny ColQwen2 as it is (real CPU model, nothing simulated)", False)]

    enc = BenchEncoder(path, batch_size=args.batch, prep_workers=args.workers)
    try:
        started = time.perf_counter()
        workers = len(enc._pool.start()) if enc._pool else 0  # not part of any figure
        print(f"preprocessing workers: {workers} (depth {enc._pool.depth if enc._pool else 0}), "
              f"started in {time.perf_counter() - started:.1f}s; model on {enc.device}")
        if enc.device == "cpu":  # the model gets the cores the workers leave: no oversubscribing
            import torch

            torch.set_num_threads(max(1, (os.cpu_count() or 2) - workers))
            print(f"torch threads for the CPU model: {torch.get_num_threads()}")
        enc.encode_images(jpegs[:args.batch])
        enc.encode_queries(["warm up"])
        for title, simulate in runs:
            enc.simulate = simulate
            if simulate:
                prep = prep_cost_s(enc, jpegs)
                enc.page_cost_s = SIM_PAGE_FACTOR * prep
                enc.call_cost_s, enc.query_cost_s = H200_QUERY_CALL_S, H200_QUERY_EXTRA_S
                title += (f"\n   (preparation {prep * 1000:.1f} ms a page measured; "
                          f"simulated model "
                          f"{enc.page_cost_s * 1000:.1f} ms a page, queries "
                          f"{H200_QUERY_CALL_S * 1000:.0f} ms + {H200_QUERY_EXTRA_S * 1000:.2f} ms "
                          f"a query a call)")
            pages = page_rates(enc, jpegs, args.repeat)
            queries = query_rates(enc, args.callers, args.repeat)
            report(title, pages, queries, args.callers)
    finally:
        enc.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
