"""Masked-LM and question-answering heads of BERT and ModernBERT: parity with transformers (logits at real tokens,
losses, gradients), the masked-LM convention (positions=, sparse logits at labelled tokens), the tied decoder
through from_hf / from_pretrained / save_pretrained, bad input, and accelerate() under transformers' pipelines."""
from __future__ import annotations

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc import testing
from fastenc.layers import prepack

# every accelerate() call here must run the fastenc path (a fallback to transformers fails the test)
pytestmark = pytest.mark.filterwarnings("error::fastenc.models.hf.FallbackWarning")
TOL = 1e-4
CASES = [("bert", "masked_lm"), ("bert", "question_answering"), ("modernbert", "masked_lm"),
         ("modernbert", "question_answering")]
IDS = [f"{a}-{t}" for a, t in CASES]


def _make(arch, task, **kw):
    return getattr(_hf, arch)(task, layers=2, hidden=48 if arch == "bert" else 64, heads=4, **kw)


def _batch(arch, seed=5):
    # ModernBERT: padding shorter than half the 128-token window, so every padded query sees real keys
    lengths = [17, 1, 63, 40] if arch == "bert" else [90, 40, 77, 70]
    return _hf.text_batch(lengths, seed=seed)


def _text(arch, ids, mask, types):
    return (ids, mask, types) if arch == "bert" else (ids, mask)


def _hf_kw(arch, ids, mask, types):
    return dict(input_ids=ids, attention_mask=mask, **({"token_type_ids": types} if arch == "bert" else {}))


def _close(out, ref, tol=TOL):
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    assert torch.isfinite(out).all()
    err = float((out - ref).detach().abs().max())
    assert err <= tol, f"max abs error {err:.3e} > {tol:.0e}"


def _mlm_labels(ids, mask, seed=0):
    """-100 except ~15% of the real tokens (at least one per row)."""
    g = torch.Generator().manual_seed(seed)
    pick = (torch.rand(ids.shape, generator=g) < 0.15) & mask.bool()
    pick[:, 0] = True
    return torch.where(pick, ids, torch.full_like(ids, -100))


@pytest.mark.parametrize("arch,task", CASES, ids=IDS)
def test_parity_logits_and_loss(arch, task):
    hf = _make(arch, task)
    fe = fastenc.from_hf(hf)
    ids, mask, types = _batch(arch)
    m = mask.bool()
    kw = _hf_kw(arch, ids, mask, types)
    with torch.no_grad():
        ref = hf(**kw)
        out = fe(*_text(arch, ids, mask, types))
    if task == "masked_lm":
        assert out.shape == ref.logits.shape and bool((out[~m] == 0).all())
        _close(out[m], ref.logits[m])
        labels = _mlm_labels(ids, mask)
        with torch.no_grad():
            ref = hf(**kw, labels=labels)
            res = fe(*_text(arch, ids, mask, types), labels=labels)
        assert type(res).__name__ == "MaskedLMOutput"
        _close(res.logits, ref.logits[labels != -100])  # sparse: the labelled tokens only, row-major
        _close(res.loss, ref.loss)
    else:
        start, end = out
        assert bool((start[~m] == 0).all()) and bool((end[~m] == 0).all())
        _close(start[m], ref.start_logits[m])
        _close(end[m], ref.end_logits[m])
        seq = ids.shape[1]
        sp, ep = torch.tensor([3, 0, seq + 7, 12]), torch.tensor([5, 0, 20, seq])  # out of range: ignored
        with torch.no_grad():
            ref = hf(**kw, start_positions=sp, end_positions=ep)
            res = fe(*_text(arch, ids, mask, types), start_positions=sp, end_positions=ep)
        assert type(res).__name__ == "QuestionAnsweringModelOutput"
        _close(res.loss, ref.loss)  # (transformers' softmax includes the padded columns)
        _close(res.start_logits[m], ref.start_logits[m])


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_masked_lm_positions(arch):
    hf = _make(arch, "masked_lm")
    fe = fastenc.from_hf(hf)
    ids, mask, types = _batch(arch)
    text = _text(arch, ids, mask, types)
    full = fe(*text)
    want = torch.zeros_like(mask, dtype=torch.bool)
    want[0, 16], want[2, 3], want[2, 0], want[3, 39] = True, True, True, True
    _close(fe(*text, positions=want), full[want])
    pairs = torch.tensor([[3, 39], [0, 16], [2, 3]])  # any order: rows of the result follow it
    _close(fe(*text, positions=pairs), full[pairs[:, 0], pairs[:, 1]])
    labels = _mlm_labels(ids, mask, seed=1)
    labels[3, 39], labels[0, 16] = 7, -100  # (one labelled, one ignored among the positions asked for)
    res = fe(*text, labels=labels, positions=pairs)
    assert res.logits.shape == (3, fe.config.vocab_size)
    at = labels[pairs[:, 0], pairs[:, 1]]
    ref = torch.nn.functional.cross_entropy(full[pairs[:, 0], pairs[:, 1]], at, ignore_index=-100)
    assert abs(float(res.loss.detach()) - float(ref.detach())) < 1e-5
    name = type(fe).__name__
    with pytest.raises(ValueError, match=rf"{name}: positions must be \(row, column\) inside \(batch, seq\) = "
                                         rf"\(4, {ids.shape[1]}\), got \(4, 0\)"):
        fe(*text, positions=torch.tensor([[0, 0], [4, 0]]))
    col = int(mask[1].sum()) + 4
    with pytest.raises(ValueError, match=rf"positions must be real tokens, got the padded position \(1, {col}\)"):
        fe(*text, positions=torch.tensor([[1, col]]))
    with pytest.raises(ValueError, match=r"positions \(bool\) must have input_ids' shape"):
        fe(*text, positions=want[:, :3])
    bad = labels.clone()
    bad[1, col] = 7
    with pytest.raises(ValueError, match=rf"labels must be -100 at padded positions \(attention_mask 0\), got 7 at "
                                         rf"\(1, {col}\)"):
        fe(*text, labels=bad)
    with pytest.raises(ValueError, match=r"labels must be class indices in \[0, 211\)"):
        fe(*text, labels=torch.full_like(ids, 999))


def test_bad_question_answering_input():
    hf = _make("bert", "question_answering")
    fe = fastenc.from_hf(hf)
    ids, mask, types = _batch("bert")
    with pytest.raises(ValueError, match="start_positions and end_positions must be given together"):
        fe(ids, mask, types, start_positions=torch.tensor([1, 2, 3, 4]))
    with pytest.raises(ValueError, match=r"end_positions must have 4 elements \(one per sequence\), got shape \(3,\)"):
        fe(ids, mask, types, start_positions=torch.tensor([1, 2, 3, 4]), end_positions=torch.tensor([1, 2, 3]))
    cfg = fastenc.from_hf(_make("bert", "base")).config
    cfg.num_labels = 3
    with pytest.raises(ValueError, match=r"question answering needs num_labels=2 \(start, end logits\), got 3"):
        type(fe)(cfg)


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_tied_decoder_round_trip(tmp_path, arch):
    hf = _make(arch, "masked_lm")
    fe = fastenc.from_hf(hf)
    word = fe.embeddings.word.weight if arch == "bert" else fe.embeddings.tok.weight
    assert sum(p is word for p in fe.parameters()) == 1  # one Parameter: the decoder reads the embedding
    ids, mask, types = _batch(arch)
    text = _text(arch, ids, mask, types)
    ref = fe(*text)
    hf.save_pretrained(tmp_path / "hf")  # transformers stores the tied decoder weight once
    loaded = fastenc.from_pretrained(tmp_path / "hf")
    _close(loaded(*text), ref, tol=0)
    with torch.no_grad():  # the tie holds after loading: changing the embedding changes the logits
        (loaded.embeddings.word if arch == "bert" else loaded.embeddings.tok).weight.mul_(2)
    assert float((loaded(*text) - ref).detach().abs().max()) > 1e-3
    fe.save_pretrained(tmp_path / "fe")
    back = getattr(_hf.transformers, type(hf).__name__).from_pretrained(tmp_path / "fe")
    back.eval()
    with torch.no_grad():
        logits = back(**_hf_kw(arch, ids, mask, types)).logits
    _close(logits[mask.bool()], ref[mask.bool()])
    again = fastenc.from_pretrained(tmp_path / "fe")
    _close(again(*text), ref, tol=0)


@pytest.mark.parametrize("path", ["panels", "onednn"])
@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_packed_decoder_in_inference(monkeypatch, arch, path):
    """A vocabulary large enough for the packed CPU GEMM (fastenc.layers.prepack: fastenc's panels, or oneDNN's as a
    call takes it with the extension not loaded): same logits, and the pack follows an in-place change of the
    embedding."""
    if path == "onednn":
        if not torch.backends.mkldnn.is_available():
            pytest.skip("torch built without oneDNN")
        monkeypatch.setattr(prepack, "use_panels", lambda x, w: False)
    t = _hf.transformers
    small = dict(vocab_size=2111, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=72,
                 attn_implementation="eager")
    if arch == "bert":
        hf = _hf._init(t.BertForMaskedLM(t.BertConfig(**small)), 1)
    else:
        hf = _hf._init(t.ModernBertForMaskedLM(t.ModernBertConfig(**small, pad_token_id=0, bos_token_id=1,
                                                                  eos_token_id=2, cls_token_id=1, sep_token_id=2)), 1)
    fe = fastenc.from_hf(hf, copy=False)
    ids, mask, types = _hf.text_batch([50, 23], vocab=2111, seed=6)  # (73 rows: fastenc.layers.prepack.min_rows)
    kw = _hf_kw(arch, ids, mask, types)
    m = mask.bool()
    for _ in range(2):
        with torch.inference_mode():
            out = fe(*_text(arch, ids, mask, types))
        with torch.no_grad():
            ref = hf(**kw).logits
            _close(out[m], ref[m])
            hf.get_input_embeddings().weight.mul_(1.5)  # shared with fe: the next call must repack
    head = fe.mlm if arch == "bert" else fe.head
    assert head.__dict__.get("_panels" if path == "panels" else "_pack") is not None  # the packed path ran


@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=["bf16"])
def test_low_precision_masked_lm(dtype):
    hf = _make("bert", "masked_lm")
    ids, mask, types = _batch("bert", seed=8)
    m = mask.bool()
    with torch.no_grad():
        ref32 = hf(ids, attention_mask=mask, token_type_ids=types).logits[m]
        ref_lowp = _make("bert", "masked_lm").to(dtype)(ids, attention_mask=mask, token_type_ids=types).logits[m]
    fe = fastenc.from_hf(hf).to(dtype=dtype)
    out = fe(ids, mask, types)
    assert out.dtype == dtype
    testing.assert_close(out[m].float(), ref32, ref_lowp.float(), dtype=dtype)


@pytest.mark.parametrize("arch,task", CASES, ids=IDS)
def test_training_loss_and_gradients(arch, task):
    """labels= in train mode (dropout off): transformers' loss and gradients on a few parameters, fp32."""
    off = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0} if arch == "bert" else {}
    hf = _make(arch, task, **off).train()
    fe = fastenc.from_hf(hf).train()
    ids, mask, types = _batch(arch, seed=9)
    if task == "masked_lm":
        lab = {"labels": _mlm_labels(ids, mask, seed=2)}
    else:
        lab = {"start_positions": torch.tensor([3, 0, 200, 12]), "end_positions": torch.tensor([5, 0, 20, 30])}
    ref = hf(**_hf_kw(arch, ids, mask, types), **lab)
    out = fe(*_text(arch, ids, mask, types), **lab)
    _close(out.loss, ref.loss)
    ref.loss.backward()
    out.loss.backward()
    hp, fp = dict(hf.named_parameters()), dict(fe.named_parameters())
    if arch == "bert":
        p = "bert."
        pairs = [("embeddings.word.weight", f"{p}embeddings.word_embeddings.weight"),
                 ("layers.1.mlp.fc1.weight", f"{p}encoder.layer.1.intermediate.dense.weight"),
                 ("embeddings.token_type.weight", f"{p}embeddings.token_type_embeddings.weight")]
        pairs.append(("mlm.dense.weight", "cls.predictions.transform.dense.weight") if task == "masked_lm"
                     else ("qa_outputs.weight", "qa_outputs.weight"))
    else:
        pairs = [("embeddings.tok.weight", "model.embeddings.tok_embeddings.weight"),
                 ("layers.1.mlp.Wi.weight", "model.layers.1.mlp.Wi.weight"), ("head.dense.weight", "head.dense.weight")]
        if task == "masked_lm":
            pairs.append(("decoder_bias", "decoder.bias"))
    for f, h in pairs:
        g, r = fp[f].grad, hp[h].grad
        assert g is not None and float(r.abs().max()) > 0, f
        _close(g, r, tol=1e-4 * max(1.0, float(r.abs().max())))


# ---- accelerate() and transformers' pipelines --------------------------------------------------------------------

_CORPUS = ["the cat sat on the mat", "a dog ran in the park", "paris is the capital of france",
           "who wrote the book about the sea", "the river flows to the sea", "she read a book in the garden",
           "berlin is a city in germany", "the quick brown fox jumps over the lazy dog"]


def _tokenizer(vocab: int, arch: str):
    """A WordPiece tokenizer trained on a few strings ([PAD] [UNK] [CLS] [SEP] [MASK] = ids 0-4), padded with
    filler tokens to exactly `vocab` entries, as transformers' fast tokenizer."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(_CORPUS, trainers.WordPieceTrainer(vocab_size=vocab, special_tokens=special))
    tok.add_tokens([f"filler{i}" for i in range(vocab - tok.get_vocab_size())])
    assert tok.get_vocab_size() == vocab
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if arch == "bert" else [])
    return _hf.transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", model_input_names=names)


@pytest.mark.parametrize("arch,task", CASES, ids=IDS)
def test_accelerate_shapes_and_loss(arch, task):
    """transformers' output fields and shapes, labels included (BERT's dense masked-LM logits; ModernBERT's
    sparse_prediction)."""
    extra = {"sparse_prediction": True} if (arch, task) == ("modernbert", "masked_lm") else {}
    hf = _make(arch, task, **extra)
    acc = fastenc.accelerate(hf)
    ids, mask, types = _batch(arch, seed=3)
    m = mask.bool()
    kw = _hf_kw(arch, ids, mask, types)
    lab = ({"labels": _mlm_labels(ids, mask, seed=4)} if task == "masked_lm" else
           {"start_positions": torch.tensor([1, 0, 9, 500]), "end_positions": torch.tensor([4, 0, 9, 2])})
    n = torch.tensor(5) if arch == "modernbert" else None  # (ModernBERT's loss divides by it; BERT's ignores it)
    with torch.no_grad():
        ref = type(hf).__mro__[0].forward(hf, **kw, **lab, num_items_in_batch=n)
        out = acc(**kw, **lab, num_items_in_batch=n)
    assert type(out) is type(ref)
    _close(out.loss, ref.loss)
    if task == "masked_lm":
        assert out.logits.shape == ref.logits.shape
        _close(out.logits if extra else out.logits[m], ref.logits if extra else ref.logits[m])
    else:
        _close(out.start_logits[m], ref.start_logits[m])
        _close(out.end_logits[m], ref.end_logits[m])


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_pipeline_fill_mask(arch):
    pipeline = _hf.transformers.pipeline
    tok = _tokenizer(211, arch)
    hf = _make(arch, "masked_lm")
    texts = ["the cat sat on the [MASK]", "paris is the [MASK] of france"]
    plain = pipeline("fill-mask", model=hf, tokenizer=tok, top_k=5)(texts)
    fast = pipeline("fill-mask", model=fastenc.accelerate(hf), tokenizer=tok, top_k=5)(texts)
    for p, f in zip(plain, fast):
        assert [c["token"] for c in f] == [c["token"] for c in p]
        assert max(abs(c["score"] - d["score"]) for c, d in zip(f, p)) < 1e-5


def _answer(model, tok, question: str, context: str) -> tuple[str, float]:
    """Extractive answer span as the former question-answering pipeline chose it (transformers 5 has no such
    pipeline): context tokens only, start <= end < start + 15, best start + end logit."""
    enc = tok(question, context, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")[0]
    ctx = torch.tensor([s == 1 for s in enc.sequence_ids(0)])
    with torch.no_grad():
        out = model(**enc)
    start = out.start_logits[0].masked_fill(~ctx, float("-inf"))
    end = out.end_logits[0].masked_fill(~ctx, float("-inf"))
    score = start[:, None] + end[None, :]
    i = torch.arange(score.shape[0])
    score = score.masked_fill((i[None, :] < i[:, None]) | (i[None, :] >= i[:, None] + 15), float("-inf"))
    best = int(score.argmax())
    a, b = divmod(best, score.shape[1])
    return context[int(offsets[a][0]):int(offsets[b][1])], float(score.flatten()[best])


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_question_answering_spans(arch):
    tok = _tokenizer(211, arch)
    hf = _make(arch, "question_answering", seed=3)
    acc = fastenc.accelerate(hf)
    for q, c in (("who wrote the book", "she read a book in the garden by the sea"),
                 ("what is the capital of france", "paris is the capital of france")):
        (ref, ref_score), (got, score) = _answer(hf, tok, q, c), _answer(acc, tok, q, c)
        assert got == ref and abs(score - ref_score) < 1e-4


def test_pipeline_text_classification():
    tok = _tokenizer(211, "bert")
    hf = _make("bert", "sequence_classification")
    texts = ["the cat sat on the mat", "berlin is a city", "a dog"]
    pipeline = _hf.transformers.pipeline
    plain = pipeline("text-classification", model=hf, tokenizer=tok, top_k=None)(texts)
    fast = pipeline("text-classification", model=fastenc.accelerate(hf), tokenizer=tok, top_k=None)(texts)
    for p, f in zip(plain, fast):
        assert [c["label"] for c in f] == [c["label"] for c in p]
        assert max(abs(c["score"] - d["score"]) for c, d in zip(f, p)) < 1e-5


@pytest.mark.parametrize("arch", ["roberta", "electra", "distilbert"])
def test_question_answering_loss_over_padded_columns(arch):
    # BERT's relatives share BERT's question-answering forward: transformers' loss on a padded batch (its softmax
    # includes the padded columns' logits, computed as transformers computes them)
    hf = getattr(_hf, arch)("question_answering", layers=2)
    fe = fastenc.from_hf(hf)
    lengths = [17, 1, 63, 40]
    if arch == "roberta":
        (ids, mask), types = _hf.roberta_batch(lengths, seed=3), None
    elif arch == "distilbert":
        (ids, mask, _), types = _hf.text_batch(lengths, seed=3), None
    else:
        ids, mask, types = _hf.text_batch(lengths, seed=3)
    sp, ep = torch.tensor([3, 0, 70, 12]), torch.tensor([5, 0, 20, 63])
    kw = dict(input_ids=ids, attention_mask=mask, **({} if types is None else {"token_type_ids": types}))
    with torch.no_grad():
        ref = hf(**kw, start_positions=sp, end_positions=ep)
        res = fe(ids, mask, types, start_positions=sp, end_positions=ep)
    _close(res.loss, ref.loss)
    m = mask.bool()
    _close(res.end_logits[m], ref.end_logits[m])


def test_modernbert_question_answering_loss_with_long_padding():
    # rows padded by 64+ columns (and a mask with holes): a padded query past the 64-column half window sees no
    # real token in the local layers, where transformers' eager softmax is uniform over the whole row
    hf = _make("modernbert", "question_answering")
    fe = fastenc.from_hf(hf)
    ids, mask, _ = _hf.text_batch([150, 20, 70, 130], seed=3)
    holes = mask.clone()
    holes[3, 10:20] = 0
    holes[2, 5] = 0
    sp, ep = torch.tensor([3, 0, 140, 12]), torch.tensor([5, 100, 20, 63])
    for m in (mask, holes):
        with torch.no_grad():
            ref = hf(input_ids=ids, attention_mask=m, start_positions=sp, end_positions=ep)
            res = fe(ids, m, start_positions=sp, end_positions=ep)
        _close(res.loss, ref.loss)
        b = m.bool()
        _close(res.start_logits[b], ref.start_logits[b])
        _close(res.end_logits[b], ref.end_logits[b])
