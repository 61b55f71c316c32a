"""The server's quantize setting: /info reports the mode and the int8 GEMM's path, the embeddings agree with
sentence-transformers' fp32 ones, a reranker serves int8 too, and bad values are refused naming the setting."""
import numpy as np
import pytest
from _server import serving

TEXTS = ["The quick brown fox jumps over the lazy dog.", "A man is eating a piece of bread.",
         "Encoders do retrieval and classification " * 9, "emoji 🙂 and accents: café, naïve"]


def test_int8_embeddings_and_info(minilm_dir):
    from sentence_transformers import SentenceTransformer

    from fastenc.corpus.quantization import int8_path

    with serving(minilm_dir, quantize="int8") as s, s.client() as c:
        info = c.get("/info").json()
        got = np.asarray(c.post("/embed", json={"inputs": TEXTS}).json())
    q = info["quantization"]
    assert q["mode"] == "int8" and q["int8_path"] == int8_path() and q["layers"] == 24 and q["kept_fp32"] == []
    ref = SentenceTransformer(str(minilm_dir), device="cpu").encode(TEXTS, normalize_embeddings=True)
    cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() > 0.99, cos


def test_fp32_info_says_none(reranker_dir):
    with serving(reranker_dir) as s, s.client() as c:
        assert c.get("/info").json()["quantization"] is None


def test_int8_reranker(reranker_dir):
    with serving(reranker_dir, quantize="int8") as s, s.client() as c:
        assert c.get("/info").json()["quantization"]["mode"] == "int8"
        r = c.post("/rerank", json={"query": "a cat", "texts": ["a cat sat", "stock prices fell"]})
    assert r.status_code == 200 and len(r.json()) == 2


@pytest.mark.parametrize("bad", ["int4", 8, "INT8"])
def test_bad_setting(bad):
    from fastenc.serve import create_app

    with pytest.raises(ValueError, match=r"serve: quantize must be one of int8"):
        create_app(None, quantize=bad)


def test_unquantizable_placement_fails_the_load():
    from fastenc.serve.service import Service
    from fastenc.serve.settings import Limits

    with pytest.raises(ValueError, match="serve: quantize int8 runs on the CPU, got device=cuda"):
        Service(None, Limits(quantize="int8"), "cuda").load()
