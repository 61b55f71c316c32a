"""Reranking and classification: the Python API (model.score / model.rerank against CrossEncoder.predict / rank),
the server's /rerank, /v1/rerank (the cohere client), /predict (transformers' probabilities) and token labels."""
import numpy as np
import pytest
import torch
from _server import serving

QUERY = "how do encoders rank documents"
DOCS = ["Encoders rank documents by scoring each query-document pair.", "A recipe for bread.",
        "Cross-encoders read the query and the document together.", "x", "Completely unrelated text " * 30]


@pytest.fixture(scope="module")
def cross_encoder(reranker_dir):
    from sentence_transformers import CrossEncoder
    return CrossEncoder(str(reranker_dir), device="cpu")


def test_score_matches_cross_encoder(reranker_dir, cross_encoder):
    import fastenc
    model = fastenc.from_pretrained(reranker_dir)
    pairs = [(QUERY, d) for d in DOCS]
    ref = cross_encoder.predict(pairs)
    got = model.score(pairs)
    assert got.shape == (len(DOCS),)
    assert np.abs(got.numpy() - ref).max() <= 1e-5
    raw = model.score(pairs, raw=True)
    assert np.abs(torch.sigmoid(raw).numpy() - ref).max() <= 1e-5
    assert not np.allclose(raw.numpy(), ref)  # raw scores are the logits, not the probabilities


def test_rerank_matches_cross_encoder_rank(reranker_dir, cross_encoder):
    import fastenc
    model = fastenc.from_pretrained(reranker_dir)
    ref = cross_encoder.rank(QUERY, DOCS, return_documents=True)
    got = model.rerank(QUERY, DOCS, return_documents=True)
    assert [r["index"] for r in got] == [r["corpus_id"] for r in ref]
    assert np.allclose([r["score"] for r in got], [r["score"] for r in ref], atol=1e-5)
    assert [r["text"] for r in got] == [DOCS[r["corpus_id"]] for r in ref]
    assert [r["index"] for r in model.rerank(QUERY, DOCS, top_n=2)] == [r["corpus_id"] for r in ref[:2]]


def test_score_and_rerank_bad_input(reranker_dir, classifier_dir, minilm_dir):
    import fastenc
    model = fastenc.from_pretrained(reranker_dir)
    with pytest.raises(TypeError, match="pairs must be"):
        model.score([("only one",)])
    with pytest.raises(ValueError, match="top_n"):
        model.rerank(QUERY, DOCS, top_n=0)
    with pytest.raises(TypeError, match="documents must be"):
        model.rerank(QUERY, "not a list")
    with pytest.raises(ValueError, match="one-label"):
        fastenc.from_pretrained(classifier_dir).rerank(QUERY, DOCS)
    with pytest.raises(TypeError, match="sequence-classification"):
        fastenc.from_pretrained(minilm_dir).score([(QUERY, DOCS[0])])


@pytest.fixture(scope="module")
def reranker(reranker_dir):
    with serving(reranker_dir) as s:
        yield s


def test_tei_rerank(reranker, cross_encoder):
    ref = cross_encoder.rank(QUERY, DOCS)
    with reranker.client() as c:
        r = c.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True})
        raw = c.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True}).json()
    assert r.status_code == 200, r.text
    got = r.json()
    assert [g["index"] for g in got] == [x["corpus_id"] for x in ref]
    assert np.allclose([g["score"] for g in got], [x["score"] for x in ref], atol=1e-5)
    assert all(g["text"] == DOCS[g["index"]] for g in got)
    by_index = {g["index"]: g["score"] for g in raw}
    assert np.allclose([1 / (1 + np.exp(-by_index[x["corpus_id"]])) for x in ref], [x["score"] for x in ref],
                       atol=1e-5)


def test_cohere_client_rerank(reranker, cross_encoder):
    cohere = pytest.importorskip("cohere")
    ref = cross_encoder.rank(QUERY, DOCS)
    client = cohere.ClientV2(api_key="unused", base_url=reranker.url)
    resp = client.rerank(model=reranker.state.service.name, query=QUERY, documents=DOCS, top_n=3)
    assert [r.index for r in resp.results] == [x["corpus_id"] for x in ref[:3]]
    assert np.allclose([r.relevance_score for r in resp.results], [x["score"] for x in ref[:3]], atol=1e-5)
    with reranker.client() as c:  # the v1 / Jina shape: documents as objects, return_documents
        v1 = c.post("/v1/rerank", json={"query": QUERY, "documents": [{"text": d} for d in DOCS],
                                        "return_documents": True}).json()
    assert [r["index"] for r in v1["results"]] == [x["corpus_id"] for x in ref]
    assert all(r["document"]["text"] == DOCS[r["index"]] for r in v1["results"])


def test_reranker_predict_pairs(reranker, cross_encoder):
    """/predict on a cross-encoder scores pairs ([a, b] alone is one pair, as TEI reads it)."""
    ref = cross_encoder.predict([(QUERY, DOCS[0]), (QUERY, DOCS[1])])
    with reranker.client() as c:
        one = c.post("/predict", json={"inputs": [QUERY, DOCS[0]]}).json()
        two = c.post("/predict", json={"inputs": [[QUERY, DOCS[0]], [QUERY, DOCS[1]]]}).json()
    assert np.isclose(one[0]["score"], ref[0], atol=1e-5)
    assert np.allclose([row[0]["score"] for row in two], ref, atol=1e-5)


def test_predict_matches_transformers(classifier_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    hf = AutoModelForSequenceClassification.from_pretrained(classifier_dir).eval()
    tok = AutoTokenizer.from_pretrained(classifier_dir)
    texts = ["I like you.", "I hate you.", "meh " * 40]
    with torch.no_grad():
        probs = torch.softmax(hf(**tok(texts, padding=True, return_tensors="pt")).logits, -1).numpy()
    with serving(classifier_dir) as s, s.client() as c:
        got = c.post("/predict", json={"inputs": texts}).json()
        single = c.post("/predict", json={"inputs": texts[0]}).json()
        root = c.post("/", json={"inputs": texts[0]}).json()
        info = c.get("/info").json()
        rerank = c.post("/rerank", json={"query": "q", "texts": ["a"]})
    for row, p in zip(got, probs):
        assert [x["label"] for x in row] == [hf.config.id2label[int(j)] for j in np.argsort(-p, kind="stable")]
        assert np.allclose([x["score"] for x in row], np.sort(p)[::-1], atol=1e-5)
    assert single == got[0] and root == got[0]
    assert info["model_type"] == {"classifier": {"id2label": {"0": "negative", "1": "neutral", "2": "positive"}}}
    assert rerank.status_code == 400 and "does not serve rerank" in rerank.json()["error"]


def test_token_classification(tagger_dir):
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    hf = AutoModelForTokenClassification.from_pretrained(tagger_dir).eval()
    tok = AutoTokenizer.from_pretrained(tagger_dir)
    text = "Ada Lovelace lived in London."
    enc = tok(text, return_tensors="pt", return_offsets_mapping=True)
    offsets = enc.pop("offset_mapping")[0].tolist()
    with torch.no_grad():
        probs = torch.softmax(hf(**enc).logits[0], -1).numpy()
    with serving(tagger_dir) as s, s.client() as c:
        got = c.post("/predict", json={"inputs": text}).json()
    real = [i for i, (a, b) in enumerate(offsets) if a != b]
    assert [g["index"] for g in got] == real
    for g in got:
        i = g["index"]
        assert g["entity"] == hf.config.id2label[int(probs[i].argmax())]
        assert abs(g["score"] - probs[i].max()) <= 1e-5
        assert g["word"] == text[offsets[i][0]:offsets[i][1]]
