"""App factory for multi-process serving (``uvicorn --factory``): settings come from the
environment because each worker process builds its own app."""

from __future__ import annotations

import gc
import os
import sys

from fastapi import FastAPI

from ..serving.cache import PRELOAD_FORMS
from ..serving.limits import Limits
from .admission import AdmissionLimits
from .app import create_app

ENV_INDEX = "VRAG_RETRIEVER_INDEX"
ENV_API_KEY = "VRAG_RETRIEVER_API_KEY"
ENV_PRELOAD = "VRAG_RETRIEVER_PRELOAD"
ENV_MAX_IN_FLIGHT = "VRAG_RETRIEVER_MAX_IN_FLIGHT"
ENV_MAX_QUEUE = "VRAG_RETRIEVER_MAX_QUEUE"
ENV_MAX_WAIT = "VRAG_RETRIEVER_MAX_WAIT_S"
ENV_THREADS = "VRAG_RETRIEVER_THREADS"
ENV_QUEUE_SERVICES = "VRAG_RETRIEVER_QUEUE_SERVICES"  # "none": max_wait_s alone
ENV_FOLLOW = "VRAG_RETRIEVER_FOLLOW_INDEX_S"
ENV_MAX_ANSWER_BYTES = "VRAG_RETRIEVER_MAX_ANSWER_BYTES"


def admission_from_env() -> AdmissionLimits:
    default = AdmissionLimits()
    return AdmissionLimits(
        max_in_flight=int(os.environ.get(ENV_MAX_IN_FLIGHT, default.max_in_flight)),
        max_queue=int(os.environ.get(ENV_MAX_QUEUE, default.max_queue)),
        max_wait_s=float(os.environ.get(ENV_MAX_WAIT, default.max_wait_s)),
        threads=int(os.environ.get(ENV_THREADS, default.threads)),
        queue_services=_optional_float(os.environ.get(ENV_QUEUE_SERVICES, default.queue_services)))


def limits_from_env() -> Limits:
    return Limits(max_answer_bytes=int(os.environ.get(ENV_MAX_ANSWER_BYTES,
                                                      Limits.max_answer_bytes)))


def _optional_float(value) -> float | None:
    return None if value is None or str(value).lower() == "none" else float(value)


# GIL hand-over interval in a serving process. The event loop thread (reading requests,
# refusing, /health) waits up to this long for the GIL while worker threads compute; CPython's
# default of 5 ms makes every wake-up of the loop that slow under load.
SWITCH_INTERVAL_S = 0.001


def _preload_from_env(value: str) -> bool | str:
    # "0": no preload; "1" (older launchers, from before MessagePack answers): base64, as then.
    if value in ("", "0"):
        return False
    if value == "1":
        return "json"
    if value not in PRELOAD_FORMS:
        raise ValueError(f"{ENV_PRELOAD}={value!r}: expected 0, 1 or one of {sorted(PRELOAD_FORMS)}")
    return value


def app_from_env() -> FastAPI:
    index = os.environ.get(ENV_INDEX)
    if not index:
        raise RuntimeError(f"set {ENV_INDEX} to an index directory")
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # this process only serves
    app = create_app(index, api_key=os.environ.get(ENV_API_KEY) or None,
                     preload=_preload_from_env(os.environ.get(ENV_PRELOAD, "0")),
                     admission=admission_from_env(), limits=limits_from_env(),
                     follow_index_s=float(os.environ.get(ENV_FOLLOW, "0")) or None)
    # What exists now (libraries, the loaded index) lives as long as the process: frozen, the
    # garbage collector's full passes skip it. Under a flood of requests those passes came every
    # few seconds and each stopped the event loop for about 60 ms (measured).
    gc.freeze()
    return app
