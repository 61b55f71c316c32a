"""Bad input gets its 4xx JSON error and the server answers the next good request; overload is 429 at once; a
failing forward fails only its batch; a client that goes away is dropped before its forward; the API key."""
import json
import socket
import threading
import time

import numpy as np
import pytest
from _server import serving

GOOD = {"inputs": ["a good request"]}


@pytest.fixture(scope="module")
def server(minilm_dir):
    with serving(None, max_client_batch_size=4, payload_limit=4096) as s:
        yield s


BAD = [
    ("/embed", b"{not json", 422, "not valid JSON"),
    ("/embed", {"inputs": 5}, 422, "inputs"),
    ("/embed", {"inputs": []}, 422, "must not be empty"),
    ("/embed", {"inputs": [""]}, 422, "empty string"),
    ("/embed", {"inputs": ["a", 3]}, 422, "inputs"),
    ("/embed", {"inputs": [[1, 2, 10 ** 9]]}, 422, "outside the vocabulary"),
    ("/embed", {"inputs": [[1, -2]]}, 422, "outside the vocabulary"),
    ("/embed", {"inputs": [[]]}, 422, "empty"),
    ("/embed", {"inputs": ["a", [101, 102]]}, 422, "all texts or all token-id"),
    ("/embed", {"inputs": ["a"] * 5}, 413, "max_client_batch_size of 4"),
    ("/embed", {"inputs": ["a"], "normalize": "yes"}, 422, "normalize"),
    ("/embed", {"inputs": ["a"], "truncation_direction": "up"}, 422, "truncation_direction"),
    ("/embed", {"inputs": ["word " * 400], "truncate": False}, 413, "over the model's maximum"),
    ("/embed", {"inputs": ["x" * 5000]}, 413, "payload limit of 4096"),
    ("/v1/embeddings", {"input": "a", "model": "some-other-model"}, 404, "not served here"),
    ("/v1/embeddings", {"input": "a", "encoding_format": "int8"}, 422, "encoding_format"),
    ("/v1/embeddings", {"input": "a", "dimensions": 0}, 422, "dimensions"),
    ("/v1/embeddings", {"nothing": 1}, 422, "input"),
    ("/rerank", {"query": "q", "texts": ["a"]}, 400, "does not serve rerank"),
    ("/predict", {"inputs": "a"}, 400, "does not serve prediction"),
    ("/tokenize", {"inputs": []}, 422, "must not be empty"),
    ("/nowhere", {}, 404, "no route"),
]


@pytest.mark.parametrize("path,body,status,words", BAD, ids=[f"{p}-{s}-{w[:18]}" for p, _, s, w in BAD])
def test_bad_input(server, path, body, status, words):
    with server.client() as c:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = c.post(path, content=content, headers={"content-type": "application/json"})
        assert r.status_code == status, r.text
        err = r.json()
        assert set(err) == {"error", "error_type"} and words in err["error"], err
        ok = c.post("/embed", json=GOOD)
        assert ok.status_code == 200 and np.array(ok.json()).shape == (1, 384)


def test_chunked_body_over_the_limit(server):
    """A body sent without a Content-Length is counted as it arrives."""
    def chunks():
        yield b'{"inputs": ["'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"]}'

    with server.client() as c:
        r = c.post("/embed", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and "payload limit" in r.json()["error"]
        assert c.post("/embed", json=GOOD).status_code == 200


def test_metrics_count_routes_and_statuses(server):
    with server.client() as c:
        c.post("/embed", json=GOOD)
        c.post("/embed", json={"inputs": []})
        text = c.get("/metrics").text
    for name in ("fastenc_requests_total", "fastenc_request_duration_seconds_bucket", "fastenc_queue_duration_seconds",
                 "fastenc_tokenization_duration_seconds", "fastenc_inference_duration_seconds", "fastenc_batch_size",
                 "fastenc_batch_tokens", "fastenc_queue_depth", "fastenc_in_flight_inputs"):
        assert name in text, name
    assert 'fastenc_requests_total{route="/embed",status="200"}' in text
    assert 'fastenc_requests_total{route="/embed",status="422"}' in text


def test_openapi_schema_lists_the_routes(server):
    with server.client() as c:
        spec = c.get("/openapi.json").json()
    for path in ("/embed", "/v1/embeddings", "/rerank", "/v1/rerank", "/predict", "/tokenize", "/health", "/info"):
        assert path in spec["paths"], path
    body = spec["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "input" in body["properties"]


class Gate:
    """Wraps a service's forward: blocks each call until released, counts the rows it ran, fails when told."""

    def __init__(self, service):
        self.forward, self.rows, self.fail = service.forward, [], False
        self.entered, self.release = threading.Event(), threading.Event()
        service.forward = self

    def __call__(self, ids, mask, types):
        self.entered.set()
        assert self.release.wait(60)
        self.rows.append(int(mask.shape[0]))
        if self.fail:
            self.fail = False
            raise RuntimeError("injected failure")
        return self.forward(ids, mask, types)


def _post_async(url, body, out, key):
    import httpx
    try:
        out[key] = httpx.post(url, json=body, timeout=60)
    except Exception as e:  # reported by the test
        out[key] = e


def test_overload_429_at_once_and_nothing_lost(minilm_dir):
    with serving(None, max_concurrent_requests=4) as s:
        gate = Gate(s.state.service)
        out = {}
        first = threading.Thread(target=_post_async, args=(s.url + "/embed", {"inputs": ["a", "b", "c"]}, out, 0))
        first.start()
        assert gate.entered.wait(30)  # 3 inputs in flight, in the forward
        t0 = time.perf_counter()
        with s.client() as c:
            over = c.post("/embed", json={"inputs": ["d", "e"]})
        assert over.status_code == 429 and over.headers["retry-after"] == "1"
        assert over.json()["error_type"] == "Overloaded" and time.perf_counter() - t0 < 5
        fits = threading.Thread(target=_post_async, args=(s.url + "/embed", {"inputs": ["f"]}, out, 1))
        fits.start()
        time.sleep(0.3)
        gate.release.set()
        first.join(60)
        fits.join(60)
        assert out[0].status_code == 200 and len(out[0].json()) == 3
        assert out[1].status_code == 200 and len(out[1].json()) == 1
        assert s.state.in_flight == 0


def test_failing_forward_fails_only_its_batch(minilm_dir):
    with serving(None) as s:
        gate = Gate(s.state.service)
        gate.fail = True
        gate.release.set()
        with s.client() as c:
            r = c.post("/embed", json=GOOD)
            assert r.status_code == 500 and "injected failure" in r.json()["error"]
            assert r.json()["error_type"] == "Backend"
            assert c.post("/embed", json=GOOD).status_code == 200


def test_disconnected_client_is_dropped_before_its_forward(minilm_dir):
    with serving(None) as s:
        gate = Gate(s.state.service)
        out = {}
        busy = threading.Thread(target=_post_async, args=(s.url + "/embed", {"inputs": ["a"]}, out, 0))
        busy.start()
        assert gate.entered.wait(30)  # the worker is busy: the next request waits in the queue
        body = json.dumps({"inputs": ["gone " * 10] * 7}).encode()
        host, port = s.url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 10
        while s.state.batcher.queued_inputs < 7 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert s.state.batcher.queued_inputs == 7
        sock.close()
        deadline = time.monotonic() + 10
        while s.state.in_flight > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        gate.release.set()
        busy.join(60)
        assert out[0].status_code == 200
        with s.client() as c:
            assert c.post("/embed", json=GOOD).status_code == 200
        assert 7 not in gate.rows and sum(gate.rows) == 2  # the dropped request's 7 inputs never ran


def test_api_key(minilm_dir):
    with serving(None, api_key="s3cret") as s, s.client() as c:
        assert c.get("/health").status_code == 200  # health needs no key
        for path in ("/info", "/metrics"):
            assert c.get(path).status_code == 401
        r = c.post("/embed", json=GOOD)
        assert r.status_code == 401 and r.json()["error_type"] == "Unauthorized"
        assert c.post("/embed", json=GOOD, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.post("/embed", json=GOOD, headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_draining_answers_503(minilm_dir):
    with serving(None) as s, s.client() as c:
        assert c.get("/health").json() == {"status": "ok"}
        s.state.drain()
        r = c.post("/embed", json=GOOD)
        assert r.status_code == 503 and r.json()["error_type"] == "Unhealthy"
        h = c.get("/health")
        assert h.status_code == 503 and h.json()["status"] == "draining"


def test_wrong_method_is_a_json_405(server):
    with server.client() as c:
        r = c.get("/embed")
        assert r.status_code == 405 and r.json()["error_type"] == "MethodNotAllowed"
