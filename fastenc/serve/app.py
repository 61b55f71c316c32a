"""The ASGI app: routes over one Service, the model loaded in the background at start-up (/health is 503 until
it is warm and again while draining), and a gate in front of every request that answers 503 while draining, 401
without the API key, 413 for a declared body over the payload limit, and counts requests by route and status."""
from __future__ import annotations

import hmac
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response

from fastenc.serve import schemas
from fastenc.serve.batcher import Batcher
from fastenc.serve.metrics import Metrics
from fastenc.serve.routes import Handler, error_response, json_response, not_allowed, not_found
from fastenc.serve.service import Service
from fastenc.serve.settings import Limits

log = logging.getLogger("fastenc.serve")


class AppState:
    """What the routes share: the service, its batcher, metrics, the permits in use and the server's phase."""

    def __init__(self, service: Service):
        self.service, self.limits = service, service.limits
        self.metrics = Metrics()
        self.batcher: Batcher | None = None
        self.tokenizer_pool = ThreadPoolExecutor(self.limits.tokenization_workers, "fastenc-tokenize")
        self.in_flight = 0
        self.ready = self.draining = False
        self.error: str | None = None

    def start(self) -> None:
        """Load and warm the model (if not yet), start the model worker; the app is ready after it."""
        try:
            if self.service.model is None:
                self.service.load()
            self.batcher = Batcher(self.service, self.metrics)
            self.batcher.start()
            self.ready = True
            log.info("fastenc serve: %s (%s) ready", self.service.name, self.service.kind)
        except Exception as e:  # /health says why
            self.error = f"{type(e).__name__}: {e}"
            log.error("fastenc serve: the model failed to load: %s", self.error)

    def drain(self) -> None:
        """Stop taking requests (503); queued and running work still completes."""
        self.draining = True

    def stop(self) -> None:
        self.draining = True
        if self.batcher is not None:
            self.batcher.stop(self.limits.graceful_timeout)
        self.tokenizer_pool.shutdown(wait=False)


class Gate:
    """Pure ASGI middleware in front of the routes (see the module docstring)."""

    def __init__(self, app, state: AppState):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        st, path = self.state, scope["path"]
        route = st.metrics.route(path)
        t0, status = time.perf_counter(), [500]

        async def send_counted(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            reply = self._refusal(scope, path)
            if reply is not None:
                await reply(scope, receive, send_counted)
            else:
                await self.app(scope, receive, send_counted)
        finally:
            st.metrics.requests.labels(route, str(status[0])).inc()
            st.metrics.request_time.labels(route).observe(time.perf_counter() - t0)

    def _refusal(self, scope, path: str):
        st = self.state
        if path == "/health":
            return None
        if st.draining:
            return error_response("the server is shutting down", 503, "Unhealthy")
        key = st.limits.api_key
        if key is not None:
            auth = dict(scope["headers"]).get(b"authorization", b"")
            given = auth[7:] if auth[:7].lower() == b"bearer " else b""
            if not hmac.compare_digest(given, key.encode()):
                return error_response("missing or wrong API key (Authorization: Bearer <key>)", 401,
                                      "Unauthorized", {"WWW-Authenticate": "Bearer"})
        if scope["method"] == "POST" and not st.ready:
            return error_response("the model is not loaded yet" if st.error is None else
                                  f"the model failed to load: {st.error}", 503, "Unhealthy", {"Retry-After": "1"})
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > st.limits.payload_limit:
            return error_response(f"the request body is {int(length)} bytes, over the payload limit of "
                                  f"{st.limits.payload_limit} bytes", 413, "PayloadTooLarge")
        return None


def create_app(model_dir=None, *, service: Service | None = None, device: str | None = None, **limits) -> FastAPI:
    """The app serving `model_dir` (None: the embedded all-MiniLM-L6-v2) with Limits(**limits), or an already
    loaded `service` (its limits). The model loads on a thread when the app starts."""
    if service is None:
        service = Service(model_dir, Limits.make(**limits), device)
    elif limits:
        raise TypeError("create_app: give limits or a service, not both (the service carries its limits)")
    state = AppState(service)
    if service.model is not None:  # loaded already (a Ray Serve replica): ready before any lifespan runs
        state.start()

    @asynccontextmanager
    async def lifespan(app):
        if not state.ready:
            threading.Thread(target=state.start, name="fastenc-load", daemon=True).start()
        yield
        state.stop()

    import fastenc

    app = FastAPI(title="fastenc", version=fastenc.__version__, lifespan=lifespan,
                  description="Embeddings, reranking and classification on fastenc's kernels")
    app.state.fastenc = state
    h = Handler(state)

    def post(path, body, fn, summary):
        async def endpoint(request: Request):
            return await h.handle(request, body, fn)
        endpoint.__name__ = "route_" + (path.strip("/").replace("/", "_") or "root")
        app.post(path, summary=summary, openapi_extra=schemas.body_schema(body))(endpoint)

    post("/embed", schemas.EmbedRequest, h.embed, "Embeddings (text-embeddings-inference)")
    post("/v1/embeddings", schemas.OpenAIEmbeddingRequest, h.openai_embeddings, "Embeddings (OpenAI)")
    post("/rerank", schemas.RerankRequest, h.rerank, "Rerank texts for a query (text-embeddings-inference)")
    post("/v1/rerank", schemas.CohereRerankRequest, h.cohere_rerank, "Rerank documents (Cohere / Jina)")
    post("/v2/rerank", schemas.CohereRerankRequest, h.cohere_rerank, "Rerank documents (Cohere v2)")
    post("/predict", schemas.PredictRequest, h.predict, "Classify texts or pairs (text-embeddings-inference)")
    post("/tokenize", schemas.TokenizeRequest, h.tokenize_route, "Tokenize (text-embeddings-inference)")

    app.add_api_route("/", h.root, methods=["POST"],
                      summary="Embeddings or prediction, by the model's kind (text-embeddings-inference)")

    @app.get("/health")
    async def health():
        if state.ready and not state.draining:
            return json_response({"status": "ok"})
        why = "draining" if state.draining else "failed" if state.error else "loading"
        return json_response({"status": why, **({"error": state.error} if state.error else {})}, 503)

    @app.get("/info")
    async def info():
        if not state.ready:
            return error_response("the model is not loaded yet", 503, "Unhealthy")
        return json_response(state.service.info())

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    app.add_exception_handler(404, not_found)
    app.add_exception_handler(405, not_allowed)
    app.add_middleware(Gate, state=state)
    return app
