"""The routes. Each parses and validates its body (413 over the payload limit or the client batch size, 422 for a
malformed one), takes one permit per input (429 at once over max_concurrent_requests), tokenizes off the model
thread, queues the inputs for the model worker and answers with the rows it gets back. A client that disconnects
while queued is dropped before its forward."""
from __future__ import annotations

import asyncio
import base64
import time
import uuid

import numpy as np
import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from fastenc.serve import schemas
from fastenc.serve.batcher import ForwardError, Job
from fastenc.serve.service import CLASSIFY, EMBED, TOKENS, Encoded, InputError

INLINE_CHARS = 4096  # requests with fewer characters tokenize on the event loop (a thread hop costs more)


def json_response(obj, status: int = 200, headers: dict | None = None) -> Response:
    return Response(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status,
                    media_type="application/json", headers=headers)


def error_response(message: str, status: int, error_type: str, headers: dict | None = None) -> Response:
    return json_response({"error": message, "error_type": error_type}, status, headers)


async def not_found(request: Request, exc) -> Response:
    return error_response(f"no route {request.method} {request.url.path}", 404, "NotFound")


async def not_allowed(request: Request, exc) -> Response:
    return error_response(f"{request.method} is not allowed on {request.url.path}", 405, "MethodNotAllowed")


async def read_body(request: Request, limit: int, model: type[BaseModel]):
    """The request body parsed as `model`; InputError 413 over `limit` bytes, 422 for bad JSON or fields."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise InputError(f"the request body is {declared} bytes, over the payload limit of {limit} bytes", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise InputError(f"the request body is over the payload limit of {limit} bytes", 413)
        chunks.append(chunk)
    try:
        data = orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as e:
        raise InputError(f"the request body is not valid JSON: {e}") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise InputError(f"invalid request: {where}: {first.get('msg')} ({e.error_count()} error(s))") from None


class Handler:
    """The routes of one app, over its AppState (service, batcher, metrics, permits)."""

    def __init__(self, state):
        self.state = state

    # ---- shared steps ---------------------------------------------------------------------------------------
    def check_model(self, name: str | None) -> None:
        svc = self.state.service
        if name is not None and name not in (svc.name, str(svc.folder), svc.folder.name):
            raise InputError(f"model {name!r} is not served here; this server serves {svc.name!r}", 404,
                             "NotFound")

    def check_count(self, n: int, what: str = "inputs") -> None:
        limit = self.state.limits.max_client_batch_size
        if n == 0:
            raise InputError(f"{what} must not be empty")
        if n > limit:
            raise InputError(f"{n} {what} in one request, over the max_client_batch_size of {limit}", 413)

    def check_kind(self, *kinds: str, what: str) -> None:
        svc = self.state.service
        if svc.kind not in kinds or (what == "rerank" and not svc.reranks):
            offers = {EMBED: "embeddings (/embed, /v1/embeddings)",
                      CLASSIFY: "classification (/predict)" + (" and reranking (/rerank, /v1/rerank)"
                                                                if svc.reranks else ""),
                      TOKENS: "token classification (/predict)"}[svc.kind]
            raise InputError(f"this model does not serve {what}; it serves {offers}", 400, "Unsupported")

    async def tokenize(self, texts: list, truncate, direction: str, offsets: bool = False) -> Encoded:
        svc, m = self.state.service, self.state.metrics
        for i, t in enumerate(texts):
            if (t == "") if isinstance(t, str) else any(s == "" for s in t):
                raise InputError(f"input {i} is an empty string")
        t0 = time.perf_counter()
        chars = sum(len(t) if isinstance(t, str) else len(t[0]) + len(t[1]) for t in texts)
        direction = direction.lower()
        if chars <= INLINE_CHARS:
            enc = svc.tokenize(texts, truncate=truncate, direction=direction, offsets=offsets)
        else:
            enc = await asyncio.get_running_loop().run_in_executor(
                self.state.tokenizer_pool,
                lambda: svc.tokenize(texts, truncate=truncate, direction=direction, offsets=offsets))
        m.tokenize_time.observe(time.perf_counter() - t0)
        return enc

    async def run(self, request: Request, enc: Encoded):
        """Queue the inputs and wait for their rows; a client that goes away first is dropped from the queue."""
        st = self.state
        st.metrics.input_tokens.inc(enc.tokens)
        job = Job(enc, asyncio.get_running_loop())
        st.batcher.submit(job)
        watch = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait((job.future, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if not job.future.done():
            st.batcher.cancel(job)
            job.future.cancel()
            raise asyncio.CancelledError("client disconnected")
        return job.future.result()

    async def guarded(self, request: Request, n: int, work):
        """Take n permits (429 when the server holds max_concurrent_requests inputs), run work(), release."""
        st = self.state
        if st.in_flight + n > st.limits.max_concurrent_requests:
            return error_response(f"the server is at its limit of {st.limits.max_concurrent_requests} inputs in "
                                  "flight; retry shortly", 429, "Overloaded", {"Retry-After": "1"})
        st.in_flight += n
        st.metrics.in_flight.set(st.in_flight)
        try:
            return await work()
        finally:
            st.in_flight -= n
            st.metrics.in_flight.set(st.in_flight)

    async def handle(self, request: Request, body_model, respond):
        """Parse, then respond(body) -> Response; every client mistake becomes its 4xx JSON error."""
        try:
            body = await read_body(request, self.state.limits.payload_limit, body_model)
            return await respond(request, body)
        except InputError as e:
            return error_response(str(e), e.status, e.error_type)
        except ForwardError as e:
            return error_response(str(e), 500, "Backend")
        except asyncio.CancelledError:
            return error_response("client disconnected", 499, "Cancelled")

    # ---- embeddings -----------------------------------------------------------------------------------------
    async def _embed_inputs(self, request, inputs, truncate, direction):
        if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        self.check_count(len(inputs))

        async def work():
            texts = [x for x in inputs if isinstance(x, str)]
            if texts and len(texts) != len(inputs):
                raise InputError("inputs must be all texts or all token-id lists, not both")
            if texts:
                enc = await self.tokenize(texts, truncate, direction)
            else:
                enc = self.state.service.token_ids(inputs, truncate=truncate, direction=direction.lower())
            return enc, await self.run(request, enc)
        return len(inputs), work

    async def embed(self, request: Request, body: schemas.EmbedRequest):
        self.check_kind(EMBED, what="embeddings")
        n, work = await self._embed_inputs(request, body.inputs, body.truncate, body.truncation_direction)

        async def respond():
            _, emb = await work()
            return json_response(self.state.service.finish_embeddings(emb, body.normalize, body.dimensions))
        return await self.guarded(request, n, respond)

    async def openai_embeddings(self, request: Request, body: schemas.OpenAIEmbeddingRequest):
        self.check_kind(EMBED, what="embeddings")
        self.check_model(body.model)
        n, work = await self._embed_inputs(request, body.input, None, "right")

        async def respond():
            enc, emb = await work()
            emb = self.state.service.finish_embeddings(emb, True, body.dimensions)
            if body.encoding_format == "base64":
                rows = [base64.b64encode(r.astype("<f4").tobytes()).decode() for r in emb]
            else:
                rows = list(emb)
            data = [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)]
            return json_response({"object": "list", "data": data, "model": self.state.service.name,
                                  "usage": {"prompt_tokens": enc.tokens, "total_tokens": enc.tokens}})
        return await self.guarded(request, n, respond)

    # ---- classification and reranking -----------------------------------------------------------------------
    async def _scores(self, request, query: str, docs: list[str], truncate, direction):
        """Logits (n, 1) of (query, doc) pairs and the real tokens they took."""
        enc = await self.tokenize([(query, d) for d in docs], truncate, direction)
        return enc, await self.run(request, enc)

    async def rerank(self, request: Request, body: schemas.RerankRequest):
        self.check_kind(CLASSIFY, what="rerank")
        self.check_count(len(body.texts), "texts")
        if body.query == "":
            raise InputError("query must not be empty")

        async def respond():
            _, logits = await self._scores(request, body.query, body.texts, body.truncate,
                                           body.truncation_direction)
            from fastenc.models.scoring import ranked
            scores = self.state.service.relevance(logits, body.raw_scores)
            return json_response(ranked(scores, body.texts if body.return_text else None, None))
        return await self.guarded(request, len(body.texts), respond)

    async def cohere_rerank(self, request: Request, body: schemas.CohereRerankRequest):
        self.check_kind(CLASSIFY, what="rerank")
        self.check_model(body.model)
        self.check_count(len(body.documents), "documents")
        if body.query == "":
            raise InputError("query must not be empty")
        docs = []
        for i, d in enumerate(body.documents):
            if isinstance(d, dict) and not isinstance(d.get("text"), str):
                raise InputError(f"documents.{i} must be a string or an object with a 'text' string")
            docs.append(d if isinstance(d, str) else d["text"])

        async def respond():
            enc, logits = await self._scores(request, body.query, docs, None, "right")
            scores = self.state.service.relevance(logits, False)
            order = sorted(range(len(docs)), key=lambda i: (-scores[i], i))[:body.top_n]
            results = [{"index": i, "relevance_score": scores[i],
                        **({"document": {"text": docs[i]}} if body.return_documents else {})} for i in order]
            return json_response({"id": str(uuid.uuid4()), "model": self.state.service.name, "results": results,
                                  "usage": {"total_tokens": enc.tokens},
                                  "meta": {"api_version": {"version": "2"},
                                           "billed_units": {"search_units": 1}}})
        return await self.guarded(request, len(docs), respond)

    async def predict(self, request: Request, body: schemas.PredictRequest):
        self.check_kind(CLASSIFY, TOKENS, what="prediction")
        x = body.inputs
        single = isinstance(x, str) or (len(x) == 2 and all(isinstance(t, str) for t in x))
        inputs = [x if isinstance(x, str) else tuple(x)] if single else [t if isinstance(t, str) else tuple(t)
                                                                          for t in x]
        bad = next((i for i, t in enumerate(inputs) if isinstance(t, tuple) and len(t) != 2), None)
        if bad is not None:
            raise InputError(f"inputs.{bad} must be a text or a pair of two texts, got {len(inputs[bad])} texts")
        self.check_count(len(inputs))
        svc = self.state.service
        if svc.kind == TOKENS and any(not isinstance(x, str) for x in inputs):
            raise InputError("a token classifier takes texts, not pairs")

        async def respond():
            enc = await self.tokenize(inputs, body.truncate, body.truncation_direction,
                                      offsets=svc.kind == TOKENS)
            out = await self.run(request, enc)
            if svc.kind == CLASSIFY:
                probs = out if body.raw_scores else svc.probabilities(out)
                rows = [[{"label": svc.labels[j], "score": float(p[j])} for j in np.argsort(-p, kind="stable")]
                        for p in probs]
            else:
                rows = [self._token_labels(text, logits, offs, body.raw_scores)
                        for text, logits, offs in zip(inputs, out, enc.offsets)]
            return json_response(rows[0] if single else rows)
        return await self.guarded(request, len(inputs), respond)

    def _token_labels(self, text: str, logits: np.ndarray, offsets, raw: bool) -> list[dict]:
        """Per real token: {index, word, entity, score, start, end} (the pipeline's shape, no aggregation)."""
        svc = self.state.service
        probs = logits if raw else svc.probabilities(logits)
        out = []
        for i, (a, b) in enumerate(offsets):
            if a == b:  # a special token ([CLS], [SEP]) covers no characters
                continue
            j = int(np.argmax(probs[i]))
            out.append({"index": i, "word": text[a:b], "entity": svc.labels[j], "score": float(probs[i, j]),
                        "start": int(a), "end": int(b)})
        return out

    async def tokenize_route(self, request: Request, body: schemas.TokenizeRequest):
        texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
        self.check_count(len(texts))
        return json_response(self.state.service.tokens_of(texts, body.add_special_tokens))

    async def root(self, request: Request):
        """TEI's POST /: embeddings or prediction, by what the model serves."""
        if self.state.service.kind == EMBED:
            return await self.handle(request, schemas.EmbedRequest, self.embed)
        return await self.handle(request, schemas.PredictRequest, self.predict)


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone away (the body is read by then: the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
