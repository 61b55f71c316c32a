"""LoRA training parity with transformers + PEFT: the same adapter (fastenc's add_lora, saved and loaded by
PeftModel.from_pretrained(is_trainable=True)) trained 20 AdamW steps on both sides in fp32 with dropout off, on
mixed-length padded batches: equal loss at every step, equal gradients of every adapter tensor (and of the
classifier copy) at every step, equal final A/B; BERT (query/value on the fused Wqkv), ModernBERT (Wqkv) and
ALBERT (query/value of the block every layer shares)."""
from __future__ import annotations

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc.lora import LoraLinear

STEPS, LR, REL = 20, 2e-3, 1e-4
CASES = {"bert": (["query", "value"], dict(hidden=48, heads=3, layers=2, hidden_dropout_prob=0.0,
                                           attention_probs_dropout_prob=0.0)),
         "modernbert": (["Wqkv"], dict(hidden=48, heads=3, layers=3)),
         "albert": (["query", "value"], dict(hidden=48, heads=3, layers=3, classifier_dropout_prob=0.0))}


def _pairs(fe, pm) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(PEFT name, fastenc tensor, PEFT tensor) for every trainable tensor of the adapter."""
    theirs = dict(pm.named_parameters())
    out = []
    for ad in (m.lora["default"] for m in fe.modules() if isinstance(m, LoraLinear)):
        if ad.kind == "full":
            for leaf in ("weight", "bias"):
                name = f"base_model.model.{ad.names['full']}.modules_to_save.default.{leaf}"
                out.append((name, getattr(ad, leaf), theirs[name]))
            continue
        for key, _, _, peft_name in ad.parts:
            for kind, t in (("lora_A", ad.lora_A[key]), ("lora_B", ad.lora_B[key])):
                name = f"base_model.model.{peft_name}.{kind}.default.weight"
                out.append((name, t, theirs[name]))
    assert {n for n, p in pm.named_parameters() if p.requires_grad} == {n for n, _, _ in out}
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-6)


@pytest.mark.parametrize("arch", list(CASES))
def test_twenty_adamw_steps_match_peft(arch, tmp_path):
    from peft import PeftModel

    targets, kw = CASES[arch]
    hf = getattr(_hf, arch)("sequence_classification", **kw)
    fe = fastenc.from_hf(hf).train()
    torch.manual_seed(0)
    fe.add_lora(r=8, lora_alpha=16, target_modules=targets, lora_dropout=0.0)
    fe.save_lora(tmp_path)
    pm = PeftModel.from_pretrained(hf, tmp_path, is_trainable=True).train()
    pairs = _pairs(fe, pm)
    opt_fe = torch.optim.AdamW([p for _, p, _ in pairs], lr=LR)
    opt_pm = torch.optim.AdamW([p for _, _, p in pairs], lr=LR)
    g = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        lengths = torch.randint(1, 40, (3,), generator=g).tolist()
        ids, mask, _ = _hf.text_batch(lengths, seed=step)
        labels = torch.randint(0, hf.config.num_labels, (3,), generator=g)
        for opt in (opt_fe, opt_pm):
            opt.zero_grad(set_to_none=True)
        loss_fe = fe(ids, mask, labels=labels).loss
        loss_pm = pm(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss_fe.backward()
        loss_pm.backward()
        assert abs(float(loss_fe) - float(loss_pm)) <= REL * abs(float(loss_pm)), (step, float(loss_fe),
                                                                                  float(loss_pm))
        for name, a, b in pairs:
            if b.grad is not None and float(b.grad.abs().max()) > 0:
                assert _rel(a.grad, b.grad) <= REL, (step, name, _rel(a.grad, b.grad))
            else:  # lora_A's gradient is zero while B is (the first step)
                assert a.grad is None or not a.grad.any(), (step, name)
        opt_fe.step()
        opt_pm.step()
    for name, a, b in pairs:
        assert _rel(a.detach(), b.detach()) <= REL, (name, _rel(a.detach(), b.detach()))
    assert any("lora_B" in n and float(b.abs().max()) > 1e-3 for n, _, b in pairs), "B must have trained"
