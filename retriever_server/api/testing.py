"""Run the real server (uvicorn) on loopback in a background thread, for tests and demos."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from .app import create_app


@contextlib.contextmanager
def serve_in_thread(index_dir, host: str = "127.0.0.1", port: int = 0, *,
                    startup_timeout_s: float = 30.0, **app_kwargs) -> Iterator[str]:
    """Serve ``index_dir`` (or a ready FastAPI app) and yield its base URL, e.g. ``http://127.0.0.1:PORT``.

    ``port=0`` picks a free port: the socket is bound here and handed to uvicorn, so there is no
    race between choosing a port and binding it. ``app_kwargs`` go to ``create_app``
    (``api_key=...``, ``limits=...``). The server is stopped and joined on exit.
    """
    app = index_dir if isinstance(index_dir, FastAPI) else create_app(index_dir, **app_kwargs)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False,
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name=f"retriever-{bound_port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError("retriever server did not start")
        time.sleep(0.01)
    url_host = f"[{host}]" if ":" in host else host
    try:
        yield f"http://{url_host}:{bound_port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
