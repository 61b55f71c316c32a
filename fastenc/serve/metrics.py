"""Prometheus metrics of one app (its own registry, so that several apps in one process keep theirs apart): one
per stage of a request, as text-embeddings-inference reports them."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

_SECONDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TOKENS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
ROUTES = ("/", "/embed", "/v1/embeddings", "/rerank", "/v1/rerank", "/v2/rerank", "/predict", "/tokenize",
          "/health", "/info", "/metrics", "/openapi.json", "/docs")


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("fastenc_requests", "HTTP requests by route and status", ("route", "status"),
                                registry=r)
        self.request_time = Histogram("fastenc_request_duration_seconds", "Whole request, body read to response",
                                      ("route",), buckets=_SECONDS, registry=r)
        self.queue_time = Histogram("fastenc_queue_duration_seconds", "Queued until the forward took it",
                                    buckets=_SECONDS, registry=r)
        self.tokenize_time = Histogram("fastenc_tokenization_duration_seconds", "Tokenization of one request",
                                       buckets=_SECONDS, registry=r)
        self.inference_time = Histogram("fastenc_inference_duration_seconds", "One batch's forward",
                                        buckets=_SECONDS, registry=r)
        self.batch_size = Histogram("fastenc_batch_size", "Inputs in one forward", buckets=_COUNTS, registry=r)
        self.batch_tokens = Histogram("fastenc_batch_tokens", "Real tokens in one forward", buckets=_TOKENS,
                                      registry=r)
        self.input_tokens = Counter("fastenc_input_tokens", "Real tokens of accepted inputs", registry=r)
        self.queue_depth = Gauge("fastenc_queue_depth", "Inputs waiting for the model", registry=r)
        self.in_flight = Gauge("fastenc_in_flight_inputs", "Inputs accepted and not yet answered", registry=r)

    @staticmethod
    def route(path: str) -> str:
        """The route label: a known route, else 'other' (label values stay few)."""
        return path if path in ROUTES else "other"

    def render(self) -> bytes:
        return generate_latest(self.registry)
