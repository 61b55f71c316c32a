"""BERT-family sequence classification in training / with labels runs the last layer's Wo, norms and MLP on each
sequence's first token only: logits, loss and every parameter's gradient equal those of the full last layer (BERT,
RoBERTa, ELECTRA, DistilBERT; LoRA too); without labels and without autograd every token still runs."""
import pytest
import torch
import torch.nn.functional as F

import fastenc
from tests.models import _models_hf as _hf

_NO_DROP = {"bert": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
            "distilbert": dict(dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0)}
LENGTHS = [5, 17, 1, 0, 9]  # length 1 and an empty sequence among mixed lengths


def _model(arch, layers, **kw):
    drop = _NO_DROP["distilbert" if arch == "distilbert" else "bert"]
    return getattr(_hf, arch)("sequence_classification", layers=layers, **{**drop, **kw})


def _inputs(arch):
    if arch in ("roberta", "xlm_roberta"):
        ids, mask = _hf.roberta_batch(LENGTHS)
        return ids * mask + (1 - mask), mask, None  # (pad id 1 wherever the mask is 0, the empty row too)
    ids, mask, types = _hf.text_batch(LENGTHS)
    return ids, mask, (None if arch == "distilbert" else types)


def _full_logits(model, ids, mask, types):
    x, batch = model._encode(ids, mask, types)
    return model.classify(batch.first_tokens(x))


def _count_rows(model):
    rows = []
    model.layers[-1].mlp.fc1.register_forward_hook(lambda mod, args, out: rows.append(out.shape[0]))
    return rows


def _assert_same_grads(trimmed, full):
    grads = dict(full.named_parameters())
    n = 0
    for name, p in trimmed.named_parameters():
        if p.requires_grad:
            assert p.grad is not None, name
            torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)
            n += 1
    assert n > 0


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("arch", ["bert", "roberta", "electra", "distilbert"])
def test_labels_give_the_full_path_logits_loss_and_gradients(arch, layers):
    hf = _model(arch, layers)
    trimmed, full = fastenc.from_hf(hf).train(), fastenc.from_hf(hf).train()
    ids, mask, types = _inputs(arch)
    labels = torch.tensor([0, 3, 1, 4, 2])
    rows = _count_rows(trimmed)
    out = trimmed(ids, mask, types, labels=labels)
    assert rows == [len(LENGTHS)]  # the last MLP saw one row per sequence
    want = _full_logits(full, ids, mask, types)
    torch.testing.assert_close(out.logits, want, rtol=1e-5, atol=1e-5)
    loss = F.cross_entropy(want, labels)
    torch.testing.assert_close(out.loss, loss, rtol=1e-5, atol=1e-6)
    out.loss.backward()
    loss.backward()
    _assert_same_grads(trimmed, full)


@pytest.mark.parametrize("arch", ["bert", "distilbert"])
def test_inference_with_labels_trims_and_without_runs_every_token(arch):
    fe = fastenc.from_hf(_model(arch, 2))
    ids, mask, types = _inputs(arch)
    rows = _count_rows(fe)
    # (the layers' modules run, so the hook sees them: a no-grad forward on the cpu backend takes the inference
    # plan, which calls the kernels directly)
    with torch.no_grad(), fastenc.use_backend("reference"):
        full = fe(ids, mask, types)
        out = fe(ids, mask, types, labels=torch.tensor([1, 0, 2, 2, 4]))
    assert rows == [int(mask.sum()), len(LENGTHS)]
    with torch.no_grad():  # the plan for every block but the last, which runs on the first rows
        planned = fe(ids, mask, types, labels=torch.tensor([1, 0, 2, 2, 4]))
    assert rows[2:] == [len(LENGTHS)]
    torch.testing.assert_close(planned.logits, out.logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(out.logits[3], full[3])  # the empty sequence: the classifier on zeros either way
    torch.testing.assert_close(out.logits, full, rtol=1e-5, atol=1e-5)


def test_lora_training_gradients_equal_the_full_path():
    hf = _model("bert", 2)
    ids, mask, types = _inputs("bert")
    labels = torch.tensor([4, 0, 1, 2, 3])
    models = []
    for _ in range(2):
        fe = fastenc.from_hf(hf).train()
        torch.manual_seed(0)  # (the same A initialization in both)
        fe.add_lora(r=4, lora_alpha=8, target_modules=["query", "value", "dense"])
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for p in fe.parameters():
                if p.requires_grad:  # (B starts at zero: made non-zero so every adapter changes the output)
                    p.add_(0.1 * torch.randn(p.shape, generator=g))
        models.append(fe)
    trimmed, full = models
    rows = _count_rows(trimmed)
    out = trimmed(ids, mask, types, labels=labels)
    assert rows == [len(LENGTHS)]
    want = _full_logits(full, ids, mask, types)
    torch.testing.assert_close(out.logits, want, rtol=1e-5, atol=1e-5)
    out.loss.backward()
    F.cross_entropy(want, labels).backward()
    _assert_same_grads(trimmed, full)


def test_dropout_training_runs_the_last_layer_on_first_rows():
    fe = fastenc.from_hf(_hf.distilbert("sequence_classification", layers=2, dropout=0.2)).train()
    ids, mask, _ = _inputs("distilbert")
    rows = _count_rows(fe)
    torch.manual_seed(0)
    out = fe(ids, mask, labels=torch.tensor([0, 1, 2, 3, 4]))
    out.loss.backward()
    assert rows == [len(LENGTHS)] and out.logits.shape == (len(LENGTHS), 5)
    assert all(torch.isfinite(p.grad).all() for p in fe.parameters() if p.grad is not None)


def test_accelerate_trims_unless_column0_is_padding():
    hf = _model("bert", 2).train()
    acc = fastenc.accelerate(hf).train()
    rows = _count_rows(acc.__dict__["_fastenc"])
    ids, mask, types = _hf.text_batch([7, 3, 12])
    labels = torch.tensor([1, 4, 0])
    for m in (mask, mask.flip(1)):  # right padding: trimmed; left padding: transformers' column 0 (a padded query)
        out = acc(input_ids=ids, attention_mask=m, token_type_ids=types, labels=labels)
        ref = hf(input_ids=ids, attention_mask=m, token_type_ids=types, labels=labels)
        torch.testing.assert_close(out.logits, ref.logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out.loss, ref.loss, rtol=1e-4, atol=1e-5)
    assert rows == [3, 2, int(mask.sum())]  # (left padding: the two padded column-0 queries, then every token)
