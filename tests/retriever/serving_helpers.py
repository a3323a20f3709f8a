"""Helpers for serving tests: a backend that can be held mid-search, and subprocess servers."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from PIL import Image

from retriever_server.backends.base import Backend, Hit
from retriever_server.storage.store import PageImage

ROOT = Path(__file__).resolve().parents[2]


def tiny_jpeg(shade: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (28, 28), (shade, shade, shade)).save(buf, format="JPEG")
    return buf.getvalue()


class HeldBackend(Backend):
    """Two documents of three pages; ``search`` blocks while ``hold`` is clear (fault injection:
    a server whose every slot is busy)."""

    name = "held"

    def __init__(self):
        self.hold = threading.Event()
        self.hold.set()
        self.entered = 0
        self._lock = threading.Lock()

    def documents(self):
        return {"a": 3, "b": 3}

    def search(self, queries, doc_ids, top_n):
        with self._lock:
            self.entered += 1
        self.hold.wait(30)
        return [[Hit(d, 1, 1.0)] for d in doc_ids]

    def page_image(self, doc_id, page):
        return PageImage(tiny_jpeg(page * 20), 28, 28)

    def page_text(self, doc_id, page):
        return f"{doc_id} page {page}"


def wait_until(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``vrag-retriever serve`` in a subprocess on a free loopback port; ``kill()`` is SIGKILL."""

    def __init__(self, index_dir, *extra: str, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "retriever_server.cli", "serve", "--index", str(index_dir),
             "--port", str(self.port), "--log-level", "warning", *extra],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("server did not start")
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc.stderr.close()
