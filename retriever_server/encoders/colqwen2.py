"""ColQwen2 / ColQwen2.5 through transformers (``ColQwen2ForRetrieval`` + ``ColQwen2Processor``).

Loads a local checkpoint directory in the transformers format (e.g. vidore/colqwen2-v1.0-hf,
downloaded by the user). Inference only: eval mode, no gradients, batches of ``batch_size``.
"""

from __future__ import annotations

import io
import threading
from pathlib import Path

import numpy as np

from .base import PageEncoder, checkpoint_fingerprint


class ColQwen2Encoder(PageEncoder):
    name = "colqwen2"

    def __init__(self, path: Path, device: str | None = None, batch_size: int = 4):
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
        # One call at a time into the model or its processor: the server calls in from several
        # threads, and the processor's tokenizer keeps its encode modes as state.
        self._lock = threading.Lock()

    def _embed(self, inputs) -> list[np.ndarray]:
        import torch

        with self._lock, torch.inference_mode():
            out = self.model(**inputs.to(self.device)).embeddings
        mask = inputs["attention_mask"].bool().cpu()
        rows = out.float().cpu()
        return [rows[i][mask[i]].numpy().astype(np.float32) for i in range(rows.shape[0])]

    def encode_images(self, jpegs: list[bytes]) -> list[np.ndarray]:
        from PIL import Image

        out: list[np.ndarray] = []
        for i in range(0, len(jpegs), self.batch_size):
            images = [Image.open(io.BytesIO(j)).convert("RGB") for j in jpegs[i:i + self.batch_size]]
            with self._lock:
                inputs = self.processor.process_images(images=images)
            out += self._embed(inputs)
        return out

    def encode_queries(self, queries: list[str]) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for i in range(0, len(queries), self.batch_size * 8):
            with self._lock:
                inputs = self.processor.process_queries(text=queries[i:i + self.batch_size * 8])
            out += self._embed(inputs)
        return out
