"""ELECTRA discriminator: parity with transformers (eager, fp32, random weights, embedding_size 48 != hidden 64)
for every head with mixed lengths, padding and token types; bf16 by the tolerance rule; losses; the pretraining
and generator checkpoints load as the encoder; save_pretrained round trip; accelerate and pipelines; bad input."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc import testing
from fastenc.models.hf import FallbackWarning

TOL = 1e-4
LENGTHS = [17, 1, 29, 40]
HEADS = ["base", "sequence_classification", "token_classification", "question_answering"]


def _close(out, ref, mask=None, tol=TOL):
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    out = out.detach()
    assert torch.isfinite(out).all()
    if mask is not None:
        out, ref = out[mask.bool()], ref[mask.bool()]
    err = float((out - ref).abs().max())
    assert err <= tol, f"max abs error {err:.3e} > {tol:.0e}"


def _check(task, out, ref, mask):
    """fastenc's head output against transformers' (per-token outputs on real tokens only)."""
    if task == "base":
        _close(out, ref.last_hidden_state, mask)
    elif task == "token_classification":
        _close(out, ref.logits, mask)
    elif task == "question_answering":
        _close(out[0], ref.start_logits, mask)
        _close(out[1], ref.end_logits, mask)
        assert float(out[0][~mask.bool()].abs().max()) == 0  # zeros at padding
    else:
        _close(out, ref.logits)


@pytest.mark.parametrize("task", HEADS)
def test_parity(task):
    hf = _hf.electra(task, layers=2)
    fe = fastenc.from_hf(hf)
    assert fe.embeddings.project is not None and fe.embeddings.word.weight.shape == (211, 48)
    ids, mask, types = _hf.text_batch(LENGTHS, seed=5)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types)
    _check(task, fe(ids, mask, types), ref, mask)


def test_parity_without_projection_and_other_activation():
    # embedding_size == hidden_size: no embeddings_project (neither side); the classifier head's GELU stays exact
    # whatever hidden_act is (transformers' ElectraClassificationHead).
    hf = _hf.electra("sequence_classification", layers=1, embedding=64, hidden_act="gelu_new")
    assert not hasattr(hf.electra, "embeddings_project")
    fe = fastenc.from_hf(hf)
    assert fe.embeddings.project is None
    ids, mask, types = _hf.text_batch(LENGTHS, seed=6)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types)
    _close(fe(ids, mask, types), ref.logits)


def test_bf16_by_the_tolerance_rule():
    dtype = torch.bfloat16
    hf = _hf.electra("base", layers=2)
    ids, mask, types = _hf.text_batch([17, 5, 40], seed=21)
    with torch.no_grad():
        ref32 = hf(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        ref_lowp = _hf.electra("base", layers=2).to(dtype)(ids, attention_mask=mask, token_type_ids=types)
    fe = fastenc.from_hf(hf).to(dtype=dtype)
    out = fe(ids, mask, types)
    assert out.dtype == dtype and fe.embeddings.project.weight.dtype == dtype
    m = mask.bool()
    testing.assert_close(out[m].float(), ref32[m], ref_lowp.last_hidden_state[m].float(), dtype=dtype)


@pytest.mark.parametrize("kind", ["single", "regression"])
def test_sequence_classification_loss(kind):
    num_labels = 1 if kind == "regression" else 5
    hf = _hf.electra("sequence_classification", layers=1, num_labels=num_labels)
    fe = fastenc.from_hf(hf)
    ids, mask, types = _hf.text_batch(LENGTHS, seed=8)
    g = torch.Generator().manual_seed(8)
    labels = torch.randn(4, generator=g) if kind == "regression" else torch.randint(0, 5, (4,), generator=g)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types, labels=labels)
    out = fe(ids, mask, types, labels=labels)
    assert type(out).__name__ == "SequenceClassifierOutput"
    _close(out.logits, ref.logits)
    assert abs(float(out.loss) - float(ref.loss)) <= TOL
    with pytest.raises(ValueError, match=r"labels must have shape \(4,\)"):
        fe(ids, mask, types, labels=labels[:3])


def test_token_classification_and_question_answering_losses():
    hf = _hf.electra("token_classification", layers=1)
    fe = fastenc.from_hf(hf)
    ids, mask, types = _hf.text_batch(LENGTHS, seed=9)
    labels = torch.randint(0, 5, ids.shape, generator=torch.Generator().manual_seed(9)).masked_fill(mask == 0, -100)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types, labels=labels)
    assert abs(float(fe(ids, mask, types, labels=labels).loss) - float(ref.loss)) <= TOL
    # question answering without padding (transformers' loss also reads its logits at padded positions)
    hf = _hf.electra("question_answering", layers=1)
    fe = fastenc.from_hf(hf)
    ids, mask, types = _hf.text_batch([23, 23, 23], seed=10)
    start, end = torch.tensor([3, 30, 0]), torch.tensor([5, 7, 22])  # 30: out of range, ignored
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types, start_positions=start, end_positions=end)
    out = fe(ids, mask, types, start_positions=start, end_positions=end)
    assert type(out).__name__ == "QuestionAnsweringModelOutput"
    assert abs(float(out.loss) - float(ref.loss)) <= TOL
    with pytest.raises(ValueError, match="start_positions and end_positions must be given together"):
        fe(ids, mask, types, start_positions=start)


@pytest.mark.parametrize("cls", ["ElectraForPreTraining", "ElectraForMaskedLM"])
def test_pretraining_checkpoints_load_as_the_encoder(tmp_path, cls):
    cfg = _hf.electra("base", layers=1).config
    hf = _hf._init(getattr(_hf.transformers, cls)(cfg), 3)
    hf.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [cls]
    fe = fastenc.from_pretrained(tmp_path)
    assert type(fe).__name__ == "ElectraModel" and fe.task == "base"
    ids, mask, types = _hf.text_batch(LENGTHS, seed=4)
    with torch.no_grad():
        ref = hf.electra(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    _close(fe(ids, mask, types), ref, mask)


@pytest.mark.parametrize("task", ["base", "sequence_classification"])
def test_save_pretrained_loads_in_transformers(tmp_path, task):
    hf = _hf.electra(task, layers=1)
    fastenc.from_hf(hf).save_pretrained(tmp_path)
    back = getattr(_hf.transformers, _hf.ELECTRA_CLASSES[task]).from_pretrained(tmp_path,
                                                                                attn_implementation="eager")
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    assert back.config.embedding_size == 48 and back.config.model_type == "electra"
    again = fastenc.from_pretrained(tmp_path)
    assert type(again).__name__ == type(hf).__name__
    ids, mask, types = _hf.text_batch(LENGTHS, seed=2)
    with torch.no_grad():
        _check(task, again(ids, mask, types), hf(ids, attention_mask=mask, token_type_ids=types), mask)


def test_unsupported_variants_and_bad_checkpoints(tmp_path):
    hf = _hf.electra("base", layers=1)
    d = hf.config.to_dict()
    for bad, match in (({"position_embedding_type": "relative_key"}, "position_embedding_type must be 'absolute', "
                                                                       "got 'relative_key'"),
                       ({"is_decoder": True}, "decoder ELECTRA")):
        with pytest.raises(ValueError, match=match):
            fastenc.models.electra.ElectraConfig.from_dict({**d, **bad})
    hf.config.position_embedding_type = "relative_key"
    with pytest.raises(ValueError, match="ElectraConfig: position_embedding_type"):
        fastenc.from_hf(hf)
    hf.config.position_embedding_type = "absolute"
    with pytest.raises(ValueError, match="num_labels must be 2"):
        fastenc.from_hf(_hf.electra("question_answering", layers=1, num_labels=3))
    # a checkpoint whose embeddings_project does not fit the config: the error names the tensor
    hf.save_pretrained(tmp_path)
    from safetensors.torch import load_file, save_file
    state = load_file(str(tmp_path / "model.safetensors"))
    state["embeddings_project.weight"] = state["embeddings_project.weight"][:, :40].contiguous()
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"embeddings_project\.weight must have shape \(64, 48\), got \(64, 40\)"):
        fastenc.from_pretrained(tmp_path)
    del state["embeddings_project.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing weights: \['embeddings_project\.weight'\]"):
        fastenc.from_pretrained(tmp_path)



@pytest.mark.parametrize("task,out_type", [("base", "BaseModelOutputWithPastAndCrossAttentions"),
                                           ("sequence_classification", "SequenceClassifierOutput"),
                                           ("token_classification", "TokenClassifierOutput"),
                                           ("question_answering", "QuestionAnsweringModelOutput")])
def test_accelerate(task, out_type):
    hf = _hf.electra(task, layers=1)
    acc = fastenc.accelerate(hf)
    ids, mask, types = _hf.text_batch([9, 4, 12], seed=11)
    left = torch.stack([m.roll(int((m == 0).sum())) for m in mask])  # left padding: column 0 is padding
    for m in (mask, left):
        inp = {"input_ids": ids * m, "attention_mask": m, "token_type_ids": types * m}
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            out, fast = _hf.ran_fastenc(lambda: acc(**inp))
            ref = hf(**inp)
        assert fast and type(out).__name__ == out_type == type(ref).__name__
        if task == "question_answering":
            _close(out.start_logits, ref.start_logits, m)
            _close(out.end_logits, ref.end_logits, m)
        elif task == "sequence_classification":
            _close(out.logits, ref.logits)
        else:
            key = "logits" if task == "token_classification" else "last_hidden_state"
            _close(getattr(out, key), getattr(ref, key), m)
            if task == "base":  # column 0 as transformers computes it, padding or not
                _close(out.last_hidden_state[:, 0], ref.last_hidden_state[:, 0])


TEXTS = ["the quick brown fox jumps over the lazy dog", "a fast electra model reads packed tokens",
         "padding is never read by the encoder", "dogs and foxes run in the brown field today"]


def _tokenizer(folder):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(TEXTS, trainers.WordPieceTrainer(vocab_size=200, special_tokens=special))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[(t, tok.token_to_id(t)) for t in special[2:4]])
    tok.decoder = decoders.WordPiece()
    assert tok.get_vocab_size() <= 211
    wrapped = _hf.transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                                       cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    wrapped.save_pretrained(folder)
    return _hf.transformers.AutoTokenizer.from_pretrained(folder)


def _best_spans(model, tok, questions, contexts, max_len=15):
    """Extractive question answering as transformers' former question-answering pipeline decoded it (removed from
    transformers 5.x pipelines): the context span (start <= end < start + max_len) of the highest start + end
    logit, as (answer text, start char, end char) per question."""
    enc = tok(questions, contexts, padding=True, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")
    with torch.no_grad():
        out = model(**enc)
    spans = []
    for i, ctx in enumerate(contexts):
        in_ctx = torch.tensor([s == 1 for s in enc.sequence_ids(i)])
        score = out.start_logits[i][:, None] + out.end_logits[i][None, :]
        n = score.shape[0]
        ok = in_ctx[:, None] & in_ctx[None, :] & torch.ones(n, n, dtype=torch.bool).triu().tril(max_len - 1)
        best = int(score.masked_fill(~ok, float("-inf")).flatten().argmax())
        a, b = int(offsets[i, best // n, 0]), int(offsets[i, best % n, 1])
        spans.append((ctx[a:b], a, b))
    return spans


def test_pipelines_match_transformers(tmp_path):
    from transformers import pipeline

    tok = _tokenizer(tmp_path / "tok")
    warnings.simplefilter("error", FallbackWarning)  # (the fastenc path serves every call; pytest restores filters)
    for head in ("sequence_classification", "token_classification", "question_answering"):
        folder = tmp_path / head
        _hf.electra(head, layers=1, seed=12).save_pretrained(folder)
        tok.save_pretrained(folder)
        hf = getattr(_hf.transformers, _hf.ELECTRA_CLASSES[head]).from_pretrained(folder,
                                                                                 attn_implementation="eager").eval()
        tok = _hf.transformers.AutoTokenizer.from_pretrained(folder)
        acc = fastenc.accelerate(hf)
        if head == "sequence_classification":
            ref = pipeline("text-classification", model=hf, tokenizer=tok, top_k=None)(TEXTS)
            got = pipeline("text-classification", model=acc, tokenizer=tok, top_k=None)(TEXTS)
            for r, g in zip(ref, got):
                assert [d["label"] for d in r] == [d["label"] for d in g]
                assert max(abs(a["score"] - b["score"]) for a, b in zip(r, g)) < 1e-5
        elif head == "token_classification":
            ref = pipeline("token-classification", model=hf, tokenizer=tok)(TEXTS)
            got = pipeline("token-classification", model=acc, tokenizer=tok)(TEXTS)
            assert sum(map(len, ref)) > 0
            for r, g in zip(ref, got):
                assert [(d["entity"], d["start"], d["end"]) for d in r] == [(d["entity"], d["start"], d["end"])
                                                                           for d in g]
                assert max(abs(a["score"] - b["score"]) for a, b in zip(r, g)) < 1e-5
        else:
            questions = ["which fox jumps", "what reads tokens", "what is never read", "who runs"]
            ref = _best_spans(hf, tok, questions, TEXTS)
            assert all(a for a, _, _ in ref)
            assert _best_spans(acc, tok, questions, TEXTS) == ref


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_peft_lora_adapter(tmp_path, merge):
    # PEFT's names for ELECTRA's modules (query/value, embeddings_project) map through the weight map.
    import copy

    from peft import LoraConfig, get_peft_model

    hf = _hf.electra("token_classification", layers=1)
    pm = get_peft_model(copy.deepcopy(hf), LoraConfig(r=4, lora_alpha=8,
                                                      target_modules=["query", "value", "embeddings_project"]))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    pm.eval().save_pretrained(tmp_path)
    fe = fastenc.from_hf(hf)
    fe.load_lora(tmp_path, merge=merge)
    ids, mask, types = _hf.text_batch(LENGTHS, seed=13)
    with torch.no_grad():
        ref = pm(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        base = hf(ids, attention_mask=mask, token_type_ids=types).logits
    assert float((ref - base)[mask.bool()].abs().max()) > 1e-3  # the adapter changes the outputs
    _close(fe(ids, mask, types), ref, mask)


def test_accelerate_training_gradients_reach_transformers_parameters():
    # no dropout, so both runs are deterministic: the loss and every gradient (embeddings_project's too) as
    # transformers computes them
    kw = dict(layers=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    hf, twin = _hf.electra("sequence_classification", **kw), _hf.electra("sequence_classification", **kw)
    acc = fastenc.accelerate(twin.train())
    hf.train()
    ids, mask, types = _hf.text_batch(LENGTHS, seed=14)
    labels = torch.tensor([0, 3, 1, 4])
    ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        out, fast = _hf.ran_fastenc(lambda: acc(input_ids=ids, attention_mask=mask, token_type_ids=types,
                                                labels=labels))
    assert fast and abs(float(out.loss) - float(ref.loss)) <= TOL
    ref.loss.backward()
    out.loss.backward()
    mine = dict(twin.named_parameters())
    for name, p in hf.named_parameters():
        assert mine[name].grad is not None, name
        _close(mine[name].grad, p.grad, tol=1e-4)
    assert float(mine["electra.embeddings_project.weight"].grad.abs().max()) > 0
