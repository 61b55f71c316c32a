"""RoBERTa / XLM-RoBERTa / CamemBERT through transformers' own entry points: fastenc.accelerate (every head, left
padding), transformers pipelines (fill-mask, text-classification) and a question-answering span with the same
answers as the plain model, a byte-level BPE tokenizer read by fastenc.from_pretrained(folder).encode, and a
SentenceTransformer whose transformer runs on fastenc."""
from __future__ import annotations

import warnings

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc.models.hf import FallbackWarning

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "paris is the capital of france",
         "the quick brown fox jumps over the lazy dog", "berlin is a city", "cats and dogs"]


def _max_err(out, ref, mask=None):
    if mask is not None:
        out, ref = out[mask.bool()], ref[mask.bool()]
    assert torch.isfinite(out).all()
    return float((out - ref).detach().abs().max())



@pytest.fixture(scope="module")
def tokenizer():
    """A tiny byte-level BPE (RoBERTa's special tokens and ids: <s> 0, <pad> 1, </s> 2, <unk> 3, <mask> 4)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS * 4, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                   cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>",
                                   model_max_length=128)


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta", "camembert"])
@pytest.mark.parametrize("task", ["base", "sequence_classification", "token_classification", "question_answering",
                                  "masked_lm"])
def test_accelerate_every_head_with_left_padding(family, task):
    hf = getattr(_hf, family.replace("-", "_"))(task)
    acc = fastenc.accelerate(hf)
    ids, mask = _hf.roberta_batch([9, 4, 13], seed=4)
    left = torch.stack([torch.cat([mask[1, 4:], mask[1, :4]])])  # row 1 left-padded (column 0 padding)
    ids[1] = torch.cat([ids[1, 4:], ids[1, :4]])
    mask = torch.cat([mask[:1], left, mask[2:]])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        ref = hf(input_ids=ids, attention_mask=mask)
        out, ran = _hf.ran_fastenc(lambda: acc(input_ids=ids, attention_mask=mask))
    assert ran and type(out) is type(ref)
    if task == "base":
        assert _max_err(out.last_hidden_state, ref.last_hidden_state, mask) <= 1e-4
        assert _max_err(out.pooler_output, ref.pooler_output) <= 1e-4  # column 0 even where it is padding
    elif task == "sequence_classification":
        assert _max_err(out.logits, ref.logits) <= 1e-4
    elif task == "question_answering":
        assert _max_err(out.start_logits, ref.start_logits, mask) <= 1e-4
        assert _max_err(out.end_logits, ref.end_logits, mask) <= 1e-4
    else:
        assert _max_err(out.logits, ref.logits, mask) <= 1e-4


def _folder(tmp_path, tokenizer, task):
    hf = _hf.roberta(task, vocab=len(tokenizer), seed=6)
    hf.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return hf


def test_pipelines_give_the_same_answers(tmp_path, tokenizer):
    from transformers import pipeline

    mlm = _folder(tmp_path / "mlm", tokenizer, "masked_lm")
    texts = ["the cat sat on<mask> mat", "paris is the<mask> of france", "a<mask> ran in the park"]
    plain = pipeline("fill-mask", model=mlm, tokenizer=tokenizer, top_k=5)(texts)
    fast = pipeline("fill-mask", model=fastenc.accelerate(mlm), tokenizer=tokenizer, top_k=5)(texts)
    for p, f in zip(plain, fast):
        assert [c["token"] for c in f] == [c["token"] for c in p]
        assert max(abs(c["score"] - d["score"]) for c, d in zip(f, p)) <= 1e-5
    # (transformers 5 has no question-answering pipeline: the same span choice, written out)
    qa = _folder(tmp_path / "qa", tokenizer, "question_answering")
    fast_qa = fastenc.accelerate(qa)
    for question, context in [("what is the capital of france", "paris is the capital of france"),
                              ("who ran", "a dog ran in the park and the cat sat on the mat")]:
        enc = tokenizer(question, context, return_tensors="pt")
        spans = []
        for model in (qa, fast_qa):
            with torch.no_grad():
                out = model(**enc)
            in_context = torch.tensor([s == 1 for s in enc.sequence_ids(0)])
            score = out.start_logits[0, :, None] + out.end_logits[0, None, :]
            ok = in_context[:, None] & in_context[None, :] & torch.ones_like(score, dtype=torch.bool).triu()
            best = int(score.masked_fill(~ok, float("-inf")).flatten().argmax())
            start, end = divmod(best, score.shape[1])
            spans.append((start, end, tokenizer.decode(enc["input_ids"][0, start:end + 1])))
        assert spans[1] == spans[0]
    cls = _folder(tmp_path / "cls", tokenizer, "sequence_classification")
    plain = pipeline("text-classification", model=cls, tokenizer=tokenizer)(TEXTS)
    fast = pipeline("text-classification", model=fastenc.accelerate(cls), tokenizer=tokenizer)(TEXTS)
    assert [f["label"] for f in fast] == [p["label"] for p in plain]
    assert max(abs(f["score"] - p["score"]) for f, p in zip(fast, plain)) <= 1e-5


def test_encode_tokenizes_as_transformers(tmp_path, tokenizer):
    hf = _folder(tmp_path, tokenizer, "base")
    fe = fastenc.from_pretrained(tmp_path)
    want = tokenizer(TEXTS)["input_ids"]
    assert [e.ids for e in fe.tokenizer.encode_batch(TEXTS)] == want
    assert fe.encode_defaults["max_length"] == 158  # what the 160-row position table holds
    emb = fe.encode(TEXTS, batch_size=4)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = hf(**batch).last_hidden_state
    m = batch["attention_mask"].unsqueeze(-1).float()
    assert _max_err(emb, (hidden * m).sum(1) / m.sum(1)) <= 1e-4


def test_sentence_transformer_on_accelerated_roberta(tmp_path, tokenizer):
    from sentence_transformers import SentenceTransformer, models

    _folder(tmp_path, tokenizer, "base")
    word = models.Transformer(str(tmp_path), max_seq_length=64)
    st = SentenceTransformer(modules=[word, models.Pooling(word.get_embedding_dimension(), "mean")], device="cpu")
    ref_model = word.auto_model
    ref = st.encode(TEXTS, convert_to_tensor=True, batch_size=4)
    word.model = fastenc.accelerate(word.auto_model)  # (auto_model: a read-only view of `model` here)
    assert type(word.auto_model).__mro__[1] is type(ref_model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        out, ran = _hf.ran_fastenc(lambda: st.encode(TEXTS, convert_to_tensor=True, batch_size=4))
    assert ran and _max_err(out, ref) <= 1e-4


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta", "camembert"])
def test_accelerate_masked_lm_loss_and_tied_gradients(family):
    # the word embedding is also the decoder: its gradient sums both uses, on transformers' own parameter (XLM-R's
    # transformers class names the tied tensor lm_head.decoder.weight first, RoBERTa's the embedding)
    make = getattr(_hf, family.replace("-", "_"))
    ref_model, hf = make("masked_lm"), make("masked_lm")
    acc = fastenc.accelerate(hf)
    ids, mask = _hf.roberta_batch([12, 7], seed=8)
    labels = torch.full_like(ids, -100)
    labels[0, 3], labels[1, 5], labels[0, 10] = 17, 4, 200
    ref = ref_model(input_ids=ids, attention_mask=mask, labels=labels)
    ref.loss.backward()
    out = acc(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    assert abs(float(out.loss.detach()) - float(ref.loss.detach())) <= 1e-5 and out.logits.shape == (3, 211)
    for (name, p), (_, q) in zip(ref_model.named_parameters(), hf.named_parameters()):
        assert p.grad is not None and _max_err(q.grad, p.grad) <= 1e-5, name
