"""Prometheus metrics of one server process (prometheus-client, one registry per app).

Exposed at ``GET /metrics`` in the Prometheus text format. Names:

- ``vrag_retriever_requests_total{route,code}``: answered requests, refusals included;
- ``vrag_retriever_request_duration_seconds{route}``: latency histogram, queue wait included;
- ``vrag_retriever_refusals_total{route,reason}``: 503s of admission control
  (``queue_full`` | ``deadline``);
- ``vrag_retriever_queue_depth``, ``vrag_retriever_in_flight``: the admission gate, now;
- ``vrag_retriever_index_info{version,path,backend}`` (always 1), ``vrag_retriever_index_pages``,
  ``vrag_retriever_index_documents``, ``vrag_retriever_index_loads_total``.

With ``serve --workers N`` every process has its own registry: a scrape sees one worker.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import generate_latest

# Seconds; spans a cached 1-query answer (~1 ms) to a request that waited the whole queue.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, queue_depth: Callable[[], float], in_flight: Callable[[], float]):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("vrag_retriever_requests", "Requests answered, by route and status",
                                ["route", "code"], registry=r)
        self.latency = Histogram("vrag_retriever_request_duration_seconds",
                                 "Request latency including queue wait", ["route"],
                                 buckets=_BUCKETS, registry=r)
        self.refusals = Counter("vrag_retriever_refusals", "Requests refused by admission control",
                                ["route", "reason"], registry=r)
        Gauge("vrag_retriever_queue_depth", "Requests waiting for a slot",
              registry=r).set_function(queue_depth)
        Gauge("vrag_retriever_in_flight", "Requests holding a slot",
              registry=r).set_function(in_flight)
        self.index_info = Gauge("vrag_retriever_index_info", "The index being served (value 1)",
                                ["version", "path", "backend"], registry=r)
        self.index_pages = Gauge("vrag_retriever_index_pages", "Pages in the served index", registry=r)
        self.index_documents = Gauge("vrag_retriever_index_documents",
                                     "Documents in the served index", registry=r)
        self.index_loads = Counter("vrag_retriever_index_loads",
                                   "Indexes loaded (start-up and each reload)", registry=r)
        # Labelled children, looked up once: under a flood of refusals prometheus-client's label
        # checks were a sixth of the cost of each refusal. Labels are bounded (known routes).
        self._children: dict[tuple, object] = {}

    def _child(self, metric, *labels: str):
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe(self, route: str, status: int, seconds: float) -> None:
        self._child(self.requests, route, str(status)).inc()
        self._child(self.latency, route).observe(seconds)

    def refused(self, route: str, reason: str) -> None:
        self._child(self.refusals, route, reason).inc()

    def index_loaded(self, version: str, path: str, backend: str, documents: int, pages: int) -> None:
        self.index_info.clear()  # exactly one index is "current"
        self.index_info.labels(version, path, backend).set(1)
        self.index_pages.set(pages)
        self.index_documents.set(documents)
        self.index_loads.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
