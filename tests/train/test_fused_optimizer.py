"""The caches derived from parameters see every optimizer step, fused ones included: torch's fused optimizers
(AdamW(fused=True), transformers Trainer's default) write the parameters without bumping their version counters,
so the packed GEMM weights, fastenc.accelerate's fused QKV copies and unmerged LoRA's combined A and B are also
keyed on the count of optimizer steps (fastenc/layers/steps.py). Each test builds the cache, takes one step and
checks the next inference call against the current weights."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import fastenc
from fastenc import extension, testing
from fastenc.layers import prepack
from fastenc.layers.steps import optimizer_steps
from _layers import random_linear

pytest.importorskip("transformers")
import _models_hf as _hf  # noqa: E402

OPTIMIZERS = [dict(fused=True), dict(foreach=True), dict(foreach=False)]
OPT_IDS = ["fused", "foreach", "for-loop"]


def test_torch_fused_step_bumps_no_version_counter():
    """The premise: if torch starts bumping the counter, the step count stays correct but is no longer needed."""
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    before, steps = p._version, optimizer_steps()
    torch.optim.AdamW([p], lr=0.1, fused=True).step()
    assert p._version == before and not torch.equal(p.detach(), torch.ones(3))
    assert optimizer_steps() == steps + 1


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=OPT_IDS)
@pytest.mark.parametrize("path", ["panels", "onednn"])
def test_packed_weight_sees_the_step(monkeypatch, path, opt):
    if path == "panels":
        why = extension.cpu_available()
        if why:
            pytest.skip(why)
        extension.load()
    else:
        if not torch.backends.mkldnn.is_available():
            pytest.skip("torch built without oneDNN")
        monkeypatch.setattr(prepack, "use_panels", lambda x, w: False)
    lin = random_linear(384, 392)
    x = testing.randn(97, 384)
    with torch.no_grad():
        lin(x)
    assert lin.__dict__.get("_panels" if path == "panels" else "_pack") is not None, "the packed path must have run"
    lin(x).square().mean().backward()
    torch.optim.AdamW(lin.parameters(), lr=0.05, **opt).step()
    with torch.no_grad():
        y = lin(x)
    testing.assert_close(y, F.linear(x.double(), lin.weight.double(), lin.bias.double()))


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=OPT_IDS)
def test_accelerated_model_evaluates_the_trained_weights(opt):
    hf = _hf.bert("sequence_classification", layers=2)
    ref = copy.deepcopy(hf).eval()
    acc = fastenc.accelerate(hf)
    ids, mask, _ = _hf.text_batch([9, 4], seed=3)
    with torch.no_grad():
        acc.eval()(input_ids=ids, attention_mask=mask)  # builds the fused QKV copies
    acc.train()
    out = acc(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1]))
    out.loss.backward()
    torch.optim.AdamW(hf.parameters(), lr=0.05, **opt).step()
    ref.load_state_dict(hf.state_dict())
    with torch.no_grad():
        got = acc.eval()(input_ids=ids, attention_mask=mask).logits
        want = ref(input_ids=ids, attention_mask=mask).logits
    assert float((got - want).abs().max()) <= 1e-4


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=OPT_IDS)
def test_unmerged_lora_evaluates_the_trained_adapter(opt):
    model = fastenc.from_hf(_hf.bert("sequence_classification", layers=2))
    torch.manual_seed(0)
    model.add_lora(r=4, lora_alpha=8, target_modules=["query", "value"], lora_dropout=0.0)
    ids, mask, _ = _hf.text_batch([9, 4], seed=4)
    model.train()(ids, mask, labels=torch.tensor([0, 1])).loss.backward()
    with torch.no_grad():
        before = model.eval()(ids, mask)  # caches the combined A and B (B is zero), between backward and step
    torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05, **opt).step()
    model.eval()
    with torch.no_grad():
        got = model(ids, mask)
    want = model(ids, mask).detach()  # with grad on: the adapter recombined, no cache
    assert not torch.allclose(want, before, atol=1e-3), "the step must change the output"
    testing.assert_close(got, want)
