"""The embedding routes against sentence-transformers on the embedded all-MiniLM-L6-v2: the OpenAI client
(float and base64), huggingface_hub's InferenceClient (TEI's POST /), TEI's /embed options, token-id inputs,
and 16 concurrent clients each getting their own rows back."""
import threading

import numpy as np
import pytest
from _server import serving


@pytest.fixture(scope="module")
def server(minilm_dir):
    with serving(None, max_batch_tokens=2048) as s:
        yield s


@pytest.fixture(scope="module")
def st_model(minilm_dir):
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(minilm_dir), device="cpu")


TEXTS = ["The quick brown fox jumps over the lazy dog.", "x", "Encoders do retrieval and classification " * 9,
         "Ein kurzer deutscher Satz.", "emoji 🙂 and accents: café, naïve"]


def cosines(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("fmt", [None, "float", "base64"], ids=["client-default", "float", "base64"])
def test_openai_client(server, st_model, fmt):
    """The client's default asks for base64 and decodes it itself; an explicit base64 is decoded here."""
    import base64

    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    resp = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS,
                                    **({} if fmt is None else {"encoding_format": fmt}))
    rows = [d.embedding for d in resp.data]
    if fmt == "base64":
        rows = [np.frombuffer(base64.b64decode(r), dtype="<f4") for r in rows]
    got = np.array(rows)
    ref = st_model.encode(TEXTS)
    assert got.shape == ref.shape
    assert cosines(got, ref).min() >= 0.99999
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    tokens = sum(len(e) for e in st_model.tokenizer(TEXTS)["input_ids"])
    assert resp.usage.prompt_tokens == tokens  # real tokens, special tokens included


def test_openai_dimensions_renormalize(server, st_model):
    import httpx
    r = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[:2], "dimensions": 64})
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]])
    ref = st_model.encode(TEXTS[:2])[:, :64]
    assert got.shape == (2, 64)
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    assert cosines(got, ref).min() >= 0.99999


def test_inference_client_feature_extraction(server, st_model, monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    # the test session is offline for the hub; this client talks to the loopback server only
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    got = hub.InferenceClient(server.url).feature_extraction(TEXTS[0])
    ref = st_model.encode([TEXTS[0]])
    assert np.asarray(got).shape == (1, ref.shape[1])
    assert cosines(got, ref).min() >= 0.99999


def test_embed_options(server, st_model):
    with server.client() as c:
        raw = np.array(c.post("/embed", json={"inputs": TEXTS, "normalize": False}).json())
        ref = st_model.encode(TEXTS, normalize_embeddings=False)
        # the folder's Normalize module is part of the model; normalize=false returns the pooled vectors
        assert cosines(raw, ref).min() >= 0.99999
        one = np.array(c.post("/embed", json={"inputs": TEXTS[1]}).json())
        assert one.shape == (1, 384)
        ids = st_model.tokenizer(TEXTS[:2])["input_ids"]
        by_ids = np.array(c.post("/embed", json={"inputs": ids}).json())
        assert cosines(by_ids, st_model.encode(TEXTS[:2])).min() >= 0.99999
        single_ids = np.array(c.post("/embed", json={"inputs": ids[0]}).json())
        assert cosines(single_ids, by_ids[:1]).min() >= 0.99999


def test_long_input_truncated_left_and_right(server, st_model):
    long = " ".join(f"word{i}" for i in range(600))
    with server.client() as c:
        right = np.array(c.post("/embed", json={"inputs": long}).json())
        left = np.array(c.post("/embed", json={"inputs": long, "truncation_direction": "left"}).json())
        refused = c.post("/embed", json={"inputs": long, "truncate": False})
    assert cosines(right, st_model.encode([long])).min() >= 0.99999  # sentence-transformers cuts on the right
    assert cosines(left, right).min() < 0.999
    assert refused.status_code == 413 and "input 0" in refused.json()["error"]


def test_concurrent_clients_get_their_own_rows(server, minilm_dir):
    """16 clients x 200 distinct texts (8 per request): every row is its own text's embedding."""
    import httpx

    import fastenc
    ref_model = fastenc.from_pretrained(minilm_dir)
    texts = [[f"client {c} says {w} number {i}" + " more" * (i % 7) for i, w in enumerate(
        ["alpha", "beta", "gamma", "delta"] * 50)] for c in range(16)]
    got: dict[int, list] = {}
    errors = []

    def client(c):
        try:
            rows = []
            with httpx.Client(base_url=server.url, timeout=120) as h:
                for a in range(0, 200, 8):
                    r = h.post("/embed", json={"inputs": texts[c][a:a + 8]})
                    r.raise_for_status()
                    rows.extend(r.json())
            got[c] = rows
        except Exception as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors[:3]
    for c in (0, 7, 15):
        ref = ref_model.encode(texts[c], normalize=True).numpy()
        assert cosines(got[c], ref).min() >= 0.99999
    assert server.state.batcher.batches < 16 * 25  # requests shared forwards
