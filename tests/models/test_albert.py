"""ALBERT against transformers (eager, fp32, random weights; embedding_size 40 != hidden 48, 3 heads, one shared block
run 3 times, gelu_new): every head on mixed lengths with padding, a mask with a hole and token types; shared block
groups (num_hidden_groups / inner_group_num); the CPU inference plan; first-step gradients of every head (the shared
block's summed over its uses); save_pretrained read back by transformers and fastenc, each shared tensor stored
once; AlbertForPreTraining loads as the encoder; accelerate on every head with left padding and in training; bad
configs (PEFT adapters: tests/lora/test_lora_albert.py)."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc.models.hf import FallbackWarning

TOL = 1e-4
TASKS = ["base", "sequence_classification", "token_classification", "question_answering", "masked_lm"]
SIZE = dict(hidden=48, heads=3)


def _batch(seed=5):
    """Mixed lengths (1 among them), right padding, and row 0 with a hole (a masked token among real ones)."""
    ids, mask, types = _hf.text_batch([17, 1, 29, 40], seed=seed)
    mask[0, 6] = 0
    return ids, mask, types


def _close(out, ref, mask=None, tol=TOL):
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    out = out.detach()
    assert torch.isfinite(out).all()
    if mask is not None:
        out, ref = out[mask.bool()], ref[mask.bool()]
    err = float((out - ref).abs().max())
    assert err <= tol, f"max abs error {err:.3e} > {tol:.0e}"


def _check(task, fe, out, ref, mask):
    """fastenc's head output against transformers' (per-token outputs on real tokens only)."""
    if task == "base":
        _close(out, ref.last_hidden_state, mask)
        _close(fe.pool(out), ref.pooler_output)  # (column 0 is real in every row here)
    elif task == "question_answering":
        _close(out[0], ref.start_logits, mask)
        _close(out[1], ref.end_logits, mask)
        assert float(out[0][~mask.bool()].abs().max()) == 0  # zeros at padding
    elif task == "sequence_classification":
        _close(out, ref.logits)
    else:
        _close(out, ref.logits, mask)


@pytest.mark.parametrize("task", TASKS)
def test_parity_every_head(task):
    hf = _hf.albert(task, **SIZE)
    fe = fastenc.from_hf(hf)
    assert type(fe).__name__ == type(hf).__name__ and fe.task == task
    assert len(fe.layers) == 1 and len(fe.blocks()) == 3 and all(b is fe.layers[0] for b in fe.blocks())
    assert fe.embeddings.word.weight.shape == (211, 40) and fe.embeddings.project.weight.shape == (48, 40)
    ids, mask, types = _batch()
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types)
    _check(task, fe, fe(ids, mask, types), ref, mask)


@pytest.mark.parametrize("groups,inner,layers", [(2, 2, 3), (3, 1, 2), (2, 1, 5)], ids=["g2-i2-l3", "g3-l2", "g2-l5"])
def test_shared_block_groups(groups, inner, layers):
    # layer i runs group int(i / (layers / groups)), each group its inner blocks in turn (a group no layer reaches is
    # loaded and never run); the activation per config (exact GELU here)
    from fastenc.models.albert import run_order

    hf = _hf.albert("masked_lm", groups=groups, inner=inner, layers=layers, hidden_act="gelu", **SIZE)
    fe = fastenc.from_hf(hf)
    assert len(fe.layers) == groups * inner
    assert fe.order == run_order(fe.config) and len(fe.order) == layers * inner
    want = [int(i / (layers / groups)) * inner + j for i in range(layers) for j in range(inner)]
    assert list(fe.order) == want
    ids, mask, types = _batch(seed=6)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types)
    _check("masked_lm", fe, fe(ids, mask, types), ref, mask)


def test_inference_plan_runs_every_use_of_the_shared_block(monkeypatch):
    # CPU fp32 inference: the blocks run on the direct kernels (fastenc.ops.direct.Plan), the shared one three times
    from fastenc.ops.direct import Plan

    calls, real = [], Plan.attention

    def spy(self, q, k, v, window=None):
        calls.append(q.shape[0])
        return real(self, q, k, v, window)

    monkeypatch.setattr(Plan, "attention", spy)
    hf = _hf.albert("base", **SIZE)
    fe = fastenc.from_hf(hf)
    ids, mask, types = _batch(seed=7)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        out = fe(ids, mask, types)
    assert calls == [int(mask.sum())] * 3
    _close(out, ref, mask)


@pytest.mark.parametrize("task", TASKS[1:])
def test_first_step_gradients(task):
    # train mode, dropout off: the heads' losses and every parameter's gradient as transformers' (through the inverse
    # map): the shared block's gradient sums its three uses; the masked-LM word embedding collects its decoder
    # gradient. Question answering unpadded (transformers' padded logits would enter its softmax).
    from fastenc.models import architecture, convert

    hf = _hf.albert(task, classifier_dropout_prob=0.0, **SIZE).train()
    fe = fastenc.from_hf(hf).train()
    lengths = [21, 21, 21] if task == "question_answering" else [21, 6, 1]
    ids, mask, types = _hf.text_batch(lengths, seed=12)
    g = torch.Generator().manual_seed(12)
    if task == "sequence_classification":
        labels = {"labels": torch.randint(0, 5, (3,), generator=g)}
    elif task == "question_answering":
        labels = {"start_positions": torch.tensor([2, 9, 0]), "end_positions": torch.tensor([4, 9, 20])}
    else:
        n = 5 if task == "token_classification" else 211
        lab = torch.randint(0, n, ids.shape, generator=g).masked_fill(mask == 0, -100)
        labels = {"labels": lab.masked_fill(torch.rand(ids.shape, generator=g) < 0.5, -100)}
    ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, **labels).loss
    out = fe(ids, mask, types, **labels).loss
    ref.backward()
    out.backward()
    assert abs(float(out.detach()) - float(ref.detach())) <= 1e-5
    entries = architecture.of_model(fe).entries(fe.config, fe.task)
    grads = convert.fastenc_to_hf(entries, {n: p.grad for n, p in fe.named_parameters()}, fe.config)
    want = {n: p.grad for n, p in hf.named_parameters(remove_duplicate=False)}
    assert all(p.grad is not None for p in fe.parameters())
    assert set(grads) == set(want) - set(getattr(hf, "_tied_weights_keys", None) or {})
    scale = max(float(t.abs().max()) for t in want.values() if t is not None)
    for name, got in grads.items():
        # floor 1e-2 of the largest gradient: one that is zero in theory (the QA head's bias) is fp32 noise
        _close(got, want[name], tol=1e-4 * max(float(want[name].abs().max()), 1e-2 * scale))


@pytest.mark.parametrize("task", ["base", "sequence_classification", "masked_lm"])
def test_save_pretrained_loads_in_transformers_and_fastenc(tmp_path, task):
    from safetensors.torch import load_file

    hf = _hf.albert(task, groups=2, inner=2, **SIZE)
    fastenc.from_hf(hf).save_pretrained(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    prefix = "" if task == "base" else "albert."
    assert sum(".attention.query.weight" in k for k in saved) == 4  # each of the 2 x 2 distinct blocks once
    assert f"{prefix}pooler.weight" in saved if task != "masked_lm" else "predictions.decoder.weight" not in saved
    back = getattr(_hf.transformers, _hf.ALBERT_CLASSES[task]).from_pretrained(tmp_path, attn_implementation="eager")
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    assert back.config.num_hidden_groups == 2 and back.config.inner_group_num == 2 and back.config.embedding_size == 40
    if task == "masked_lm":
        assert back.predictions.decoder.weight is back.albert.embeddings.word_embeddings.weight
    again = fastenc.from_pretrained(tmp_path)
    assert type(again).__name__ == type(hf).__name__ and (again.pooler is None) == (task == "masked_lm")
    ids, mask, types = _batch(seed=2)
    with torch.no_grad():
        _check(task, again, again(ids, mask, types), hf(ids, attention_mask=mask, token_type_ids=types), mask)


def test_pretraining_checkpoint_loads_as_the_encoder(tmp_path):
    hf = _hf._init(_hf.transformers.AlbertForPreTraining(_hf.albert("base", **SIZE).config), 3)
    hf.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["AlbertForPreTraining"]
    fe = fastenc.from_pretrained(tmp_path)
    assert type(fe).__name__ == "AlbertModel" and fe.pooler is not None
    ids, mask, types = _batch(seed=4)
    with torch.no_grad():
        ref = hf.albert(ids, attention_mask=mask, token_type_ids=types)
    _check("base", fe, fe(ids, mask, types), ref, mask)


@pytest.mark.parametrize("task,out_type", [("base", "BaseModelOutputWithPooling"),
                                           ("sequence_classification", "SequenceClassifierOutput"),
                                           ("token_classification", "TokenClassifierOutput"),
                                           ("question_answering", "QuestionAnsweringModelOutput"),
                                           ("masked_lm", "MaskedLMOutput")])
def test_accelerate_every_head(task, out_type):
    hf = _hf.albert(task, **SIZE)
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
        elif task == "base":  # the pooler reads column 0 as transformers computes it, padding or not
            _close(out.last_hidden_state, ref.last_hidden_state, m)
            _close(out.pooler_output, ref.pooler_output)
        else:
            _close(out.logits, ref.logits, m)


def test_accelerate_training_gradients_reach_transformers_parameters():
    hf, twin = (_hf.albert("masked_lm", **SIZE).train() for _ in range(2))
    acc = fastenc.accelerate(twin)
    ids, mask, types = _batch(seed=14)
    labels = torch.full_like(ids, -100)
    labels[0, 3], labels[2, 5], labels[3, 30] = 17, 4, 200
    ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        out, fast = _hf.ran_fastenc(lambda: acc(input_ids=ids, attention_mask=mask, token_type_ids=types,
                                                labels=labels))
    assert fast and abs(float(out.loss) - float(ref.loss)) <= 1e-5 and out.logits.shape == ref.logits.shape
    ref.loss.backward()
    out.loss.backward()
    mine = dict(twin.named_parameters())
    for name, p in hf.named_parameters():
        assert mine[name].grad is not None, name
        _close(mine[name].grad, p.grad, tol=1e-5)


def test_bad_configs():
    from fastenc.models.albert import AlbertConfig

    d = _hf.albert("base").config.to_dict()
    for bad, match in (({"num_hidden_groups": 0}, "num_hidden_groups must be a positive int, got 0"),
                       ({"inner_group_num": 0}, "inner_group_num must be a positive int, got 0"),
                       ({"embedding_size": 0}, "embedding_size must be a positive int, got 0"),
                       ({"position_embedding_type": "relative_key"}, "position_embedding_type must be 'absolute'"),
                       ({"hidden_size": 50}, r"hidden_size \(50\) must be a multiple of num_attention_heads")):
        with pytest.raises(ValueError, match=match):
            AlbertConfig.from_dict({**d, **bad})
    with pytest.raises(ValueError, match="question answering needs num_labels=2"):
        fastenc.from_hf(_hf.albert("question_answering", num_labels=3))
    with pytest.raises(ValueError, match="tie_word_embeddings=False"):
        fastenc.from_hf(_hf.albert("masked_lm", tie_word_embeddings=False))
