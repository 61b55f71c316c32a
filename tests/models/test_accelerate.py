"""fastenc.accelerate: same forward signature and output type as the transformers module, no global patching; the
fastenc path provably runs (fastenc::attention in the profiler), in inference and in training (labels, dropout,
gradients on transformers' parameters), and every fallback to transformers is announced."""
from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc.models.hf import FallbackWarning

CASES = [("bert", "base", "BaseModelOutputWithPoolingAndCrossAttentions"),
         ("bert", "sequence_classification", "SequenceClassifierOutput"),
         ("bert", "token_classification", "TokenClassifierOutput"),
         ("modernbert", "base", "BaseModelOutput"),
         ("modernbert", "sequence_classification", "SequenceClassifierOutput"),
         ("modernbert", "token_classification", "TokenClassifierOutput"),
         ("vit", "base", "BaseModelOutputWithPooling"),
         ("vit", "image_classification", "ImageClassifierOutput")]
IDS = [f"{a}-{t}" for a, t, _ in CASES]


def _make(arch, task, **kw):
    small = dict(layers=1, image=32, patch=8) if arch == "vit" else dict(layers=2)
    return getattr(_hf, arch)(task, **{**small, **kw})


def _inputs(arch, seed=11):
    if arch == "vit":
        return {"pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))}
    ids, mask, _ = _hf.text_batch([9, 4], seed=seed)
    return {"input_ids": ids, "attention_mask": mask}


def _key(task):
    return "logits" if task != "base" else "last_hidden_state"


def _close(out, ref, mask=None, tol=1e-4):
    if out.dim() == 3 and mask is not None:
        out, ref = out[mask.bool()], ref[mask.bool()]
    assert torch.isfinite(out).all()
    err = float((out - ref).abs().max())
    assert err <= tol, err


@pytest.mark.parametrize("arch,task,out_type", CASES, ids=IDS)
def test_same_signature_output_type_and_fastenc_ran(arch, task, out_type):
    hf = _make(arch, task)
    original_forward = type(hf).forward
    acc = fastenc.accelerate(hf)
    assert type(hf).forward is original_forward  # nothing patched
    assert type(acc).__name__ == type(hf).__name__ and isinstance(acc, type(hf))
    assert inspect.signature(acc.forward) == inspect.signature(hf.forward)
    inp = _inputs(arch)
    with torch.no_grad():
        ref = hf(**inp)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FallbackWarning)
            out, fast = _hf.ran_fastenc(lambda: acc(**inp))
        _, slow = _hf.ran_fastenc(lambda: hf(**inp))
    assert fast and not slow
    assert type(out).__name__ == out_type == type(ref).__name__
    _close(getattr(out, _key(task)), getattr(ref, _key(task)), inp.get("attention_mask"))
    if getattr(ref, "pooler_output", None) is not None:
        _close(out.pooler_output, ref.pooler_output)
    with torch.no_grad():
        tup = acc(**inp, return_dict=False)
    assert isinstance(tup, tuple) and torch.equal(tup[0], getattr(out, _key(task)))


def _grads_by_name(model) -> dict:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch,task", [(a, t) for a, t, _ in CASES if t != "base"],
                         ids=[i for i, c in zip(IDS, CASES) if c[1] != "base"])
def test_training_runs_fastenc_with_labels_and_gradients_reach_transformers_parameters(arch, task):
    # Dropout off: the loss and every gradient (on transformers' own parameters) equal transformers' own.
    off = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0) if arch != "modernbert" else {}
    hf = _make(arch, task, **off).train()
    acc = fastenc.accelerate(hf).train()
    inp = _inputs(arch)
    b = next(iter(inp.values())).shape[0]
    n = hf.config.num_labels
    if task == "token_classification":
        inp["labels"] = torch.randint(0, n, inp["input_ids"].shape).masked_fill(inp["attention_mask"] == 0, -100)
    else:
        inp["labels"] = torch.randint(0, n, (b,))
    ref = hf(**inp)
    ref.loss.backward()
    want = _grads_by_name(hf)
    hf.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        out, fast = _hf.ran_fastenc(lambda: acc(**inp))
    assert fast and type(out).__name__ == type(ref).__name__
    assert abs(out.loss.item() - ref.loss.item()) <= 1e-5 * abs(ref.loss.item())
    out.loss.backward()
    got = _grads_by_name(hf)
    assert set(got) == set(want)
    scale = max(float(g.abs().max()) for g in want.values())
    for name, g in want.items():
        assert float((got[name] - g).abs().max()) <= 1e-4 * max(float(g.abs().max()), 1e-3 * scale), name


def test_dropout_in_training_mode_runs_fastenc_and_eval_turns_it_off():
    hf = _make("bert", "base", hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2).train()
    acc = fastenc.accelerate(hf)
    ids, mask, _ = _hf.text_batch([7, 3], seed=2)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        (a, fast), (b, _) = (_hf.ran_fastenc(lambda: acc(ids, attention_mask=mask)) for _ in range(2))
        assert fast and not torch.equal(a.last_hidden_state, b.last_hidden_state)  # dropout drew new masks
        acc.eval()
        out, fast = _hf.ran_fastenc(lambda: acc(ids, attention_mask=mask))
        ref = hf.eval()(ids, attention_mask=mask)
    assert fast
    _close(out.last_hidden_state, ref.last_hidden_state, mask)


def test_an_optimizer_step_on_transformers_parameters_is_seen_without_gradients():
    # The fused QKV weight is fastenc's own tensor in no-grad calls: it is refreshed when q, k or v change.
    hf = _make("bert", "sequence_classification")
    acc = fastenc.accelerate(hf)
    inp = _inputs("bert")
    with torch.no_grad():
        acc(**inp)
        hf.bert.encoder.layer[0].attention.self.key.weight.mul_(1.5)
        hf.bert.encoder.layer[1].attention.self.value.bias.add_(0.2)
        out, fast = _hf.ran_fastenc(lambda: acc(**inp))
        ref = hf(**inp)
    assert fast
    _close(out.logits, ref.logits)


OPTIONS = [
    ("output_hidden_states", lambda ids: {"output_hidden_states": True}, "output_hidden_states=True is not supported"),
    ("output_attentions", lambda ids: {"output_attentions": True}, "output_attentions=True is not supported"),
    ("position_ids", lambda ids: {"position_ids": torch.arange(ids.shape[1]).expand_as(ids)},
     "explicit position_ids are not supported"),
    ("mask4d", lambda ids: {"attention_mask": torch.ones(ids.shape[0], 1, ids.shape[1], ids.shape[1])},
     r"attention_mask of shape \(2, 1, 9, 9\) is not supported"),
]


@pytest.mark.parametrize("name,extra,match", OPTIONS, ids=[o[0] for o in OPTIONS])
def test_unserved_options_fall_back_with_a_warning(name, extra, match):
    hf = _make("bert", "sequence_classification")
    acc = fastenc.accelerate(hf)
    ids, mask, _ = _hf.text_batch([9, 4], seed=12)
    kw = {"attention_mask": mask, **extra(ids)}
    with torch.no_grad():
        with pytest.warns(FallbackWarning, match=match):
            out, fast = _hf.ran_fastenc(lambda: acc(ids, **kw))
        ref = hf(ids, **kw)
    assert not fast and torch.equal(out.logits, ref.logits)


def test_config_flags_and_vit_options_fall_back_with_a_warning():
    hf = _make("bert", "base")
    hf.config.output_hidden_states = True
    acc = fastenc.accelerate(hf)
    ids, mask, _ = _hf.text_batch([6, 3], seed=12)
    with torch.no_grad(), pytest.warns(FallbackWarning, match=r"config.output_hidden_states=True is not supported"):
        out = acc(ids, attention_mask=mask)
    assert out.hidden_states is not None and len(out.hidden_states) == 3
    vit = fastenc.accelerate(_make("vit", "base"))
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad(), pytest.warns(FallbackWarning, match="interpolate_pos_encoding=True is not supported"):
        _, fast = _hf.ran_fastenc(lambda: vit(x, interpolate_pos_encoding=True))
    assert not fast


def test_accelerate_rejects_unsupported():
    with pytest.raises(ValueError, match="unsupported architecture 'Linear'; supported: BertModel"):
        fastenc.accelerate(torch.nn.Linear(2, 2))
