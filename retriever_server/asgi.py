"""App factory for multi-process serving (``uvicorn --factory``): settings come from the
environment because each worker process builds its own app."""

from __future__ import annotations

import os

from fastapi import FastAPI

from .app import create_app

ENV_INDEX = "VRAG_RETRIEVER_INDEX"
ENV_API_KEY = "VRAG_RETRIEVER_API_KEY"
ENV_PRELOAD = "VRAG_RETRIEVER_PRELOAD"


def app_from_env() -> FastAPI:
    index = os.environ.get(ENV_INDEX)
    if not index:
        raise RuntimeError(f"set {ENV_INDEX} to an index directory")
    return create_app(index, api_key=os.environ.get(ENV_API_KEY) or None,
                      preload=os.environ.get(ENV_PRELOAD, "0") == "1")
