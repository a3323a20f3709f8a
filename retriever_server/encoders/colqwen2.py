"""ColQwen2 / ColQwen2.5 through transformers (``ColQwen2ForRetrieval`` + ``ColQwen2Processor``).

Loads a local checkpoint directory in the transformers format (e.g. vidore/colqwen2-v1.0-hf,
downloaded by the user). Inference only: eval mode, no gradients.

Encoding is split in two steps: ``prepare_images`` (JPEG decode + the processor: resize,
normalise, patchify into ``pixel_values`` and ``image_grid_thw``), pure CPU work, and ``_embed``
(the model). Pages: with ``prep_workers`` > 0 (the default; ``$VRAG_ENCODER_PREP_WORKERS``),
``prepare_images`` runs in worker processes that load only the processor, pipelined with the
model (see ``pipeline``); with 0 it runs in the calling thread, one batch after the other.
Queries: with ``query_batching`` (the default), concurrent ``encode_queries`` calls are gathered
into shared model calls (see ``batching``). Either way the model sees the same inputs the
processor gives in-process, and callers see the same contract (``base.PageEncoder``).

Threads: the model runs under ``_model_lock`` and the in-process processor under
``_processor_lock`` (its tokenizer keeps its encode modes as state), so tokenising queries
overlaps a page batch on the model.
"""

from __future__ import annotations

import io
import os
import threading
import weakref
from pathlib import Path

import numpy as np

from .base import PageEncoder, checkpoint_fingerprint
from .batching import QueryBatcher
from .pipeline import PreparePool, default_workers

ENV_QUERY_WINDOW_MS = "VRAG_ENCODER_QUERY_WINDOW_MS"


def prepare_images(processor, jpegs: list[bytes]):
    """The model inputs for a batch of pages: what the processor gives for the decoded JPEGs."""
    from PIL import Image

    images = [Image.open(io.BytesIO(j)).convert("RGB") for j in jpegs]
    return processor.process_images(images=images)


# --- in a preprocessing worker process (one thread: the global is set once, then only read) ---
_worker_processor = None


def _init_worker(path: str) -> None:
    global _worker_processor
    import torch
    from transformers import ColQwen2Processor

    torch.set_num_threads(1)  # one core per worker; the workers together fill the machine
    _worker_processor = ColQwen2Processor.from_pretrained(path)


def _prepare_in_worker(jpegs: list[bytes]):
    return prepare_images(_worker_processor, jpegs)
# ---


def _weak_method(method):
    """``method`` without keeping its object alive (the collector thread must not pin the
    encoder)."""
    ref = weakref.WeakMethod(method)

    def call(*args):
        bound = ref()
        if bound is None:
            raise RuntimeError("the encoder is gone")
        return bound(*args)

    return call


def _release(pool: PreparePool | None, batcher: QueryBatcher | None) -> None:
    if batcher is not None:
        batcher.close(timeout_s=0)
    if pool is not None:
        pool.close(wait=False)


class ColQwen2Encoder(PageEncoder):
    name = "colqwen2"

    def __init__(self, path: Path, device: str | None = None, batch_size: int = 4, *,
                 prep_workers: int | None = None, prep_depth: int | None = None,
                 query_batching: bool = True, query_batch: int = 64,
                 query_window_s: float | None = None, timeout_s: float = 600.0):
        import torch
        from transformers import ColQwen2ForRetrieval, ColQwen2Processor

        self.path = Path(path)
        self.spec = f"{self.name}:{self.path}"
        self.fingerprint = f"{self.name}:{checkpoint_fingerprint(self.path)}"
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        self.model = ColQwen2ForRetrieval.from_pretrained(self.path, dtype=dtype).to(self.device)
        self.model.eval()
        self.processor = ColQwen2Processor.from_pretrained(self.path)
        self.dim = int(self.model.config.embedding_dim)
        self.batch_size = batch_size
        self.query_batch = query_batch
        self._model_lock = threading.Lock()
        self._processor_lock = threading.Lock()

        workers = default_workers() if prep_workers is None else prep_workers
        self._pool = PreparePool(
            _init_worker, (str(self.path),), _prepare_in_worker, workers=workers,
            depth=prep_depth, timeout_s=timeout_s,
            preload=(__name__, "transformers.models.colqwen2.processing_colqwen2")
        ) if workers > 0 else None
        if query_window_s is None:
            query_window_s = float(os.environ.get(ENV_QUERY_WINDOW_MS, "2")) / 1000
        self._batcher = QueryBatcher(
            _weak_method(self._encode_queries_now), max_batch=query_batch,
            window_s=query_window_s, timeout_s=timeout_s,
            name=f"{self.name}-queries") if query_batching else None
        # An encoder dropped without close() (e.g. after an index build) lets its workers and
        # collector go when it is collected, not at interpreter exit.
        weakref.finalize(self, _release, self._pool, self._batcher)

    # --- the model step ---
    def _run_model(self, inputs):
        """One forward pass (under the model lock); returns the padded embeddings."""
        return self.model(**inputs.to(self.device)).embeddings

    def _embed(self, inputs) -> list[np.ndarray]:
        import torch

        with self._model_lock, torch.inference_mode():
            out = self._run_model(inputs)
        mask = inputs["attention_mask"].bool().cpu()
        rows = out.float().cpu()
        return [rows[i][mask[i]].numpy().astype(np.float32) for i in range(rows.shape[0])]

    # --- pages ---
    def _batches(self, items: list) -> list[list]:
        return [items[i:i + self.batch_size] for i in range(0, len(items), self.batch_size)]

    def encode_images(self, jpegs: list[bytes]) -> list[np.ndarray]:
        if self._pool is None or not jpegs:
            return self.encode_images_serial(jpegs)
        out: list[np.ndarray] = []
        for inputs in self._pool.imap(self._batches(jpegs)):
            out += self._embed(inputs)
        return out

    def encode_images_serial(self, jpegs: list[bytes]) -> list[np.ndarray]:
        """Pages prepared in the calling thread, then embedded, batch after batch."""
        out: list[np.ndarray] = []
        for batch in self._batches(jpegs):
            with self._processor_lock:
                inputs = prepare_images(self.processor, batch)
            out += self._embed(inputs)
        return out

    # --- queries ---
    def encode_queries(self, queries: list[str]) -> list[np.ndarray]:
        if self._batcher is None:
            return self._encode_queries_now(queries)
        return self._batcher.encode(queries)

    def _encode_queries_now(self, queries: list[str]) -> list[np.ndarray]:
        """The queries in model calls of up to ``query_batch``, in the calling thread."""
        out: list[np.ndarray] = []
        for i in range(0, len(queries), self.query_batch):
            with self._processor_lock:
                inputs = self.processor.process_queries(text=queries[i:i + self.query_batch])
            out += self._embed(inputs)
        return out

    def close(self) -> None:
        """Stop the preprocessing workers and the query collector (idempotent)."""
        if self._batcher is not None:
            self._batcher.close()
        if self._pool is not None:
            self._pool.close()
