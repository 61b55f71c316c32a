"""DistilBERT against transformers (eager attention, fp32, random weights): every head on mixed lengths with padding,
losses, the masked-LM positions convention and the tied decoder, low precision by the tolerance rule, accelerate
(each head, left padding, the fill-mask pipeline), save/load both ways, and bad checkpoints named."""
from __future__ import annotations

import re
import warnings

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc import testing
from fastenc.models.hf import FallbackWarning

TASKS = ["base", "sequence_classification", "token_classification", "question_answering", "masked_lm"]
LENGTHS = [17, 1, 129, 40]


def _close(out, ref, mask=None, tol=1e-4):
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    if mask is not None:
        out, ref = out[mask.bool()], ref[mask.bool()]
    assert torch.isfinite(out).all()
    err = float((out - ref).detach().abs().max())
    assert err <= tol, f"max abs error {err:.3e} > {tol:.0e}"


def _check(task, out, ref, mask):
    """fastenc's logits (or hidden states) against transformers' output, on the real tokens."""
    if task == "base":
        _close(out, ref.last_hidden_state, mask)
    elif task == "question_answering":
        _close(out[0], ref.start_logits, mask)
        _close(out[1], ref.end_logits, mask)
        assert not out[0][~mask.bool()].any()  # zeros at padding
    elif task == "sequence_classification":
        _close(out, ref.logits)
    else:
        _close(out, ref.logits, mask)
        assert not out[~mask.bool()].any()


@pytest.mark.parametrize("task", TASKS)
def test_parity_every_head(task):
    hf = _hf.distilbert(task)
    fe = fastenc.from_hf(hf)
    ids, mask, _ = _hf.text_batch(LENGTHS, seed=3)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask)
    _check(task, fe(ids, mask), ref, mask)


def test_parity_odd_sizes_relu_sinusoidal():
    # 3 heads of 16, relu, a sinusoidal config whose (randomized) table is read from the weights, not recomputed
    hf = _hf.distilbert("base", hidden=48, heads=3, layers=1, activation="relu", sinusoidal_pos_embds=True, seed=5)
    fe = fastenc.from_hf(hf)
    assert torch.equal(fe.embeddings.position.weight, hf.embeddings.position_embeddings.weight)
    ids, mask, _ = _hf.text_batch([33, 2, 70], seed=4)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    _close(fe(ids, mask), ref, mask)


def test_losses_match_transformers():
    ids, mask, _ = _hf.text_batch(LENGTHS, seed=6)
    g = torch.Generator().manual_seed(6)
    # sequence classification: single-label (int) and regression (num_labels=1)
    for kw, labels in (({}, torch.tensor([0, 4, 2, 1])), ({"num_labels": 1}, torch.randn(4, generator=g))):
        hf = _hf.distilbert("sequence_classification", **kw)
        fe = fastenc.from_hf(hf)
        with torch.no_grad():
            ref = hf(input_ids=ids, attention_mask=mask, labels=labels)
        out = fe(ids, mask, labels=labels)
        assert type(out).__name__ == "SequenceClassifierOutput"
        _close(out.logits, ref.logits)
        assert abs(float(out.loss) - float(ref.loss)) <= 1e-5
    # masked LM: ~30 % of the real tokens labelled, -100 elsewhere (padding included)
    hf = _hf.distilbert("masked_lm")
    fe = fastenc.from_hf(hf)
    pick = (torch.rand(ids.shape, generator=g) < 0.3) & mask.bool()
    labels = torch.where(pick, torch.randint(0, 211, ids.shape, generator=g), torch.full_like(ids, -100))
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, labels=labels)
    out = fe(ids, mask, labels=labels)
    assert type(out).__name__ == "MaskedLMOutput" and out.logits.shape == (int(pick.sum()), 211)
    _close(out.logits, ref.logits[pick])  # sparse: the labelled tokens only, row-major
    assert abs(float(out.loss) - float(ref.loss)) <= 1e-5
    # question answering on a batch without padding (transformers' loss reads its logits at padded positions)
    hf = _hf.distilbert("question_answering")
    fe = fastenc.from_hf(hf)
    full, _, _ = _hf.text_batch([30, 30], seed=7)
    start, end = torch.tensor([3, 40]), torch.tensor([9, 12])  # 40: outside the sequence, ignored as there
    with torch.no_grad():
        ref = hf(input_ids=full, start_positions=start, end_positions=end)
    out = fe(full, start_positions=start, end_positions=end)
    assert abs(float(out.loss) - float(ref.loss)) <= 1e-5


def test_masked_lm_positions_and_tied_decoder():
    hf = _hf.distilbert("masked_lm")
    fe = fastenc.from_hf(hf)
    assert fe.vocab_projector.weight is fe.embeddings.word.weight
    ids, mask, _ = _hf.text_batch(LENGTHS, seed=8)
    full = fe(ids, mask)
    want = torch.zeros_like(mask, dtype=torch.bool)
    want[0, 3] = want[2, 100] = want[3, 0] = want[1, 0] = True
    by_mask = fe(ids, mask, positions=want)
    by_pairs = fe(ids, mask, positions=torch.tensor([[0, 3], [1, 0], [2, 100], [3, 0]]))
    assert by_mask.shape == (4, 211)
    _close(by_mask, full[want], tol=1e-5)
    _close(by_pairs, full[want], tol=1e-5)
    with pytest.raises(ValueError, match=r"positions must be real tokens, got the padded position \(1, 5\)"):
        fe(ids, mask, positions=torch.tensor([[1, 5]]))
    # changing the embedding changes the decoder: one parameter
    with torch.no_grad():
        fe.embeddings.word.weight[5] += 1.0
    assert float((fe(ids, mask, positions=want) - by_mask).abs().max()) > 1e-3


def test_untied_decoder_round_trip(tmp_path):
    hf = _hf.distilbert("masked_lm", tie_word_embeddings=False)
    assert hf.vocab_projector.weight is not hf.distilbert.embeddings.word_embeddings.weight
    fe = fastenc.from_hf(hf)
    assert fe.vocab_projector.weight is not fe.embeddings.word.weight
    assert torch.equal(fe.vocab_projector.weight, hf.vocab_projector.weight)
    fe.save_pretrained(tmp_path)
    back = fastenc.from_pretrained(tmp_path)
    assert torch.equal(back.vocab_projector.weight, hf.vocab_projector.weight)


def test_bf16_by_tolerance_rule():
    hf = _hf.distilbert("base")
    ids, mask, _ = _hf.text_batch([17, 5, 40], seed=21)
    with torch.no_grad():
        ref32 = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        ref_lowp = _hf.distilbert("base").to(torch.bfloat16)(input_ids=ids, attention_mask=mask).last_hidden_state
    fe = fastenc.from_hf(hf).to(dtype=torch.bfloat16)
    out = fe(ids, mask)
    assert out.dtype == torch.bfloat16
    m = mask.bool()
    testing.assert_close(out[m].float(), ref32[m], ref_lowp[m].float(), dtype=torch.bfloat16)


@pytest.mark.parametrize("task", TASKS)
def test_accelerate_every_head(task):
    hf = _hf.distilbert(task)
    acc = fastenc.accelerate(hf)
    ids, mask, _ = _hf.text_batch([9, 4, 12], seed=11)
    mask[1, :2] = 0  # one left-padded row: column 0 (read by the classifier) is a padded query
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            out = acc(input_ids=ids, attention_mask=mask)
    assert type(out).__name__ == type(ref).__name__
    if task == "question_answering":
        _check(task, (out.start_logits, out.end_logits), ref, mask)
    elif task == "sequence_classification":
        _close(out.logits, ref.logits)
    else:
        _check(task, out.last_hidden_state if task == "base" else out.logits, ref, mask)
        if task == "base":
            _close(out.last_hidden_state[:, 0], ref.last_hidden_state[:, 0])  # column 0, padding or not
    with pytest.warns(FallbackWarning, match="token_type_ids"):  # (transformers' forward takes none)
        acc(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids))


def _tokenizer(folder):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import DistilBertTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    text = ["the cat sat on the mat", "a dog ran in the park", "the sun is hot and the sky is blue",
            "we read a book at night", "birds sing in the morning"]
    tok.train_from_iterator(text, trainers.WordPieceTrainer(
        vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    fast = DistilBertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")
    fast.save_pretrained(folder)
    return fast


def test_fill_mask_pipeline_and_from_pretrained(tmp_path):
    from transformers import pipeline

    tok = _tokenizer(tmp_path)
    hf = _hf.distilbert("masked_lm", seed=12, vocab_size=len(tok))
    hf.save_pretrained(tmp_path)
    texts = ["the cat [MASK] on the mat", "a dog ran in the [MASK]"]
    plain = pipeline("fill-mask", model=hf, tokenizer=tok, top_k=5)(texts)
    fast = pipeline("fill-mask", model=fastenc.accelerate(hf), tokenizer=tok, top_k=5)(texts)
    assert [[r["token"] for r in row] for row in fast] == [[r["token"] for r in row] for row in plain]
    for row_f, row_p in zip(fast, plain):
        assert max(abs(a["score"] - b["score"]) for a, b in zip(row_f, row_p)) <= 1e-5
    # the saved folder: fastenc.from_pretrained loads the head (checkpoint without vocab_projector.weight)
    fe = fastenc.from_pretrained(tmp_path)
    assert type(fe).__name__ == "DistilBertForMaskedLM" and fe.vocab_projector.weight is fe.embeddings.word.weight
    enc = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        ref = hf(**enc).logits
    _close(fe(enc["input_ids"], enc["attention_mask"]), ref, enc["attention_mask"])
    emb = fe.encode(["the sun is hot", "birds sing"])
    assert emb.shape == (2, 64) and torch.isfinite(emb).all()


def test_save_pretrained_loads_in_transformers(tmp_path):
    import transformers

    hf = _hf.distilbert("sequence_classification")
    fe = fastenc.from_hf(hf)
    fe.save_pretrained(tmp_path)
    back = transformers.DistilBertForSequenceClassification.from_pretrained(tmp_path, attn_implementation="eager")
    assert back.config.dim == 64 and back.config.n_layers == 2 and back.config.hidden_dim == 136
    ids, mask, _ = _hf.text_batch(LENGTHS, seed=13)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        again = back.eval()(input_ids=ids, attention_mask=mask).logits
    _close(again, ref, tol=1e-6)
    mlm = _hf.distilbert("masked_lm")
    fastenc.from_hf(mlm).save_pretrained(tmp_path / "mlm")
    back = transformers.DistilBertForMaskedLM.from_pretrained(tmp_path / "mlm")
    assert back.vocab_projector.weight is back.distilbert.embeddings.word_embeddings.weight
    assert torch.equal(back.vocab_projector.weight, mlm.vocab_projector.weight)


def test_bad_checkpoints_are_named(tmp_path):
    from safetensors.torch import load_file, save_file

    hf = _hf.distilbert("sequence_classification")
    hf.save_pretrained(tmp_path)
    st = tmp_path / "model.safetensors"
    state = load_file(str(st))
    bad = {k: v for k, v in state.items() if k != "distilbert.transformer.layer.1.ffn.lin2.weight"}
    save_file(bad, str(st))
    with pytest.raises(ValueError, match=r"missing weights: \['distilbert.transformer.layer.1.ffn.lin2.weight'\]"):
        fastenc.from_pretrained(tmp_path)
    for name, shape, want in (("distilbert.transformer.layer.0.attention.k_lin.weight", (60, 64), (64, 64)),
                              ("pre_classifier.bias", (63,), (64,)),
                              ("distilbert.embeddings.position_embeddings.weight", (100, 64), (160, 64))):
        save_file({**state, name: torch.randn(shape)}, str(st))
        with pytest.raises(ValueError, match=re.escape(f"weight {name} must have shape {want}, got {shape}")):
            fastenc.from_pretrained(tmp_path)
    # from_hf: the same check on a transformers model object
    hf.distilbert.transformer.layer[0].ffn.lin1.weight = torch.nn.Parameter(torch.randn(136, 60))
    with pytest.raises(ValueError, match=r"weight distilbert.transformer.layer.0.ffn.lin1.weight must have shape "
                                         r"\(136, 64\), got \(136, 60\)"):
        fastenc.from_hf(hf)


def test_bad_inputs_are_named():
    fe = fastenc.from_hf(_hf.distilbert("question_answering"))
    ids, mask, _ = _hf.text_batch([5, 3])
    with pytest.raises(ValueError, match="token_type_ids must be None .*no token-type embeddings"):
        fe(ids, mask, torch.zeros_like(ids))
    with pytest.raises(ValueError, match="start_positions and end_positions must be given together"):
        fe(ids, mask, start_positions=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"exceeds the position table \(max_position_embeddings=160\)"):
        fe(torch.ones(1, 161, dtype=torch.long))
    cfg = fastenc.from_hf(_hf.distilbert("base")).config
    with pytest.raises(ValueError, match="config.num_labels must be 2 .*got 5"):
        type(fe)(type(cfg).from_dict({**cfg.hf_config, "num_labels": 5}))
    with pytest.raises(ValueError, match="unsupported activation 'swiglu'"):
        type(cfg).from_dict({**cfg.hf_config, "activation": "swiglu"})


def test_training_dropout_places_and_gradients(monkeypatch):
    # dropout where transformers has it: after the embedding norm and after lin2 (none on out_lin's output),
    # seq_classif_dropout before the classifier; recorded through an identity dropout, so the training forward
    # must also equal transformers' eval forward
    hf = _hf.distilbert("sequence_classification", dropout=0.1, attention_dropout=0.0, seq_classif_dropout=0.2)
    fe = fastenc.from_hf(hf).train()
    ids, mask, _ = _hf.text_batch(LENGTHS, seed=14)
    labels = torch.tensor([1, 0, 3, 2])
    seen = []

    def identity(x, p=0.5, training=True, inplace=False, bias=None):
        seen.append(p)
        return x if bias is None else x + bias

    monkeypatch.setattr(torch.nn.functional, "dropout", identity)
    monkeypatch.setattr(fastenc.ops, "dropout", identity)  # (the layers' dropout on CPU fp32, bias fused)
    out = fe(ids, mask, labels=labels)
    assert seen == [0.1] * (1 + hf.config.n_layers) + [0.2]
    monkeypatch.undo()
    hf.train()
    for m in hf.modules():  # (transformers' dropouts off, so both sides compute the same function)
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    ref = hf(input_ids=ids, attention_mask=mask, labels=labels)
    _close(out.logits, ref.logits)
    out.loss.backward()
    ref.loss.backward()
    sa = hf.distilbert.transformer.layer[1].attention
    _close(fe.layers[1].attn.Wqkv.weight.grad, torch.cat([sa.q_lin.weight.grad, sa.k_lin.weight.grad,
                                                          sa.v_lin.weight.grad]), tol=1e-5)
    _close(fe.embeddings.position.weight.grad, hf.distilbert.embeddings.position_embeddings.weight.grad, tol=1e-5)
    _close(fe.pre_classifier.weight.grad, hf.pre_classifier.weight.grad, tol=1e-5)


def test_pad_token_row_gets_no_gradient_as_in_transformers():
    # transformers' word embedding has padding_idx=pad_token_id: a real token with the pad id adds nothing to
    # that row's gradient
    hf = _hf.distilbert("sequence_classification", dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0,
                        pad_token_id=3)
    fe = fastenc.from_hf(hf).train()
    hf.train()
    ids, mask, _ = _hf.text_batch(LENGTHS, seed=15)
    ids[:, 1] = 3  # a real token in every row
    labels = torch.tensor([1, 0, 3, 2])
    fe(ids, mask, labels=labels).loss.backward()
    hf(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    want = hf.distilbert.embeddings.word_embeddings.weight.grad
    got = fe.embeddings.word.weight.grad
    assert float(want[3].abs().max()) == 0.0 and float(got[3].abs().max()) == 0.0
    assert float(got[ids[0, 2]].abs().max()) > 0
    _close(got, want, tol=1e-5)


def test_lora_q_v_and_classifier_heads_load_in_peft(tmp_path):
    # SEQ_CLS saves the heads PEFT saves: "classifier" matches pre_classifier too (PEFT's plain suffix match)
    from peft import PeftModel

    fe = fastenc.from_hf(_hf.distilbert("sequence_classification"))
    fe.add_lora(r=4, lora_alpha=8, target_modules=["q_lin", "v_lin"])
    g = torch.Generator().manual_seed(15)
    with torch.no_grad():
        trained = [(n, p) for n, p in fe.named_parameters() if p.requires_grad]
        assert any("pre_classifier" in n for n, _ in trained) and any("lora" in n for n, _ in trained)
        for _, p in trained:
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    fe.save_lora(tmp_path)
    peft = PeftModel.from_pretrained(_hf.distilbert("sequence_classification"), tmp_path).eval()
    ids, mask, _ = _hf.text_batch([9, 4, 12], seed=2)
    with torch.no_grad():
        _close(fe.eval()(ids, mask), peft(input_ids=ids, attention_mask=mask).logits, tol=1e-5)
