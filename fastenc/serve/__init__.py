"""`fastenc serve`: one model folder behind an HTTP endpoint (install with `pip install "fastenc[serve]"`).

- settings.py  Limits: batching budgets, overload and payload limits, truncation, drain time, API key, quantize
- service.py   the model, its kind (embed / classify / rerank / token labels), tokenizers, one forward per batch
- batcher.py   the queue and the one model worker: batches cut by a budget of real tokens, run packed
- schemas.py   request bodies (pydantic): OpenAI, TEI and Cohere/Jina shapes
- routes.py    the routes; app.py builds the ASGI app (auth, payload limit, draining, metrics around them)
- metrics.py   Prometheus metrics of one app
- cli.py       `fastenc serve` (uvicorn; `--engine ray` for Ray Serve replicas, ray_app.py)

`import fastenc` imports none of this; `create_app` imports the web stack when called.
"""
from __future__ import annotations


def create_app(model_dir=None, **limits):
    """The ASGI app serving `model_dir` (None: the embedded all-MiniLM-L6-v2); limits: fastenc.serve.settings.Limits
    fields (quantize="int8" runs the model int8). The model loads in the background when the app starts; /health
    answers 503 until it is warm."""
    from fastenc.serve.app import create_app as _create_app
    return _create_app(model_dir, **limits)


__all__ = ["create_app"]
