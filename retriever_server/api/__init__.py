"""The HTTP surface: FastAPI routes over `serving/`, admission control, metrics, app factories.

The top layer but for the command line (`cli`): nothing below imports it.

- `app`: `create_app`: the routes, auth and error mapping of the wire format (docs/retriever.md).
- `schemas`: the request and response models (pydantic).
- `problems`: readable 415/422 answers to requests FastAPI cannot read.
- `admission`: bounded work in flight, a short queue and explicit 503 refusals (ASGI middleware).
- `metrics`: the Prometheus metrics of one server process (`GET /metrics`).
- `asgi`: the app factory for multi-process serving (`uvicorn --factory`), set by environment.
- `testing`: `serve_in_thread`: the real server (uvicorn) on loopback in a thread (tests, demos).
"""
