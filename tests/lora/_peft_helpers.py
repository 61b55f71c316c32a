"""PEFT-wrapped small transformers models with non-zero random lora_B (so the adapter changes the outputs)."""
from __future__ import annotations

import copy

import torch
from peft import LoraConfig, get_peft_model

from fastenc import testing


def peft_model(hf, seed: int = 0, **cfg):
    pm = get_peft_model(copy.deepcopy(hf), LoraConfig(**cfg))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name or "lora_A" in name:
                p.copy_(torch.randn(p.shape, generator=g) * (0.1 if "lora_B" in name else p.shape[-1] ** -0.5))
            elif "modules_to_save" in name:  # a trained copy of a head: make it differ from the base
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return pm.eval()


def close(out, ref, mask=None):
    """The tolerance rule (fp32) on real tokens."""
    if mask is not None:
        out, ref = out[mask.bool()], ref[mask.bool()]
    testing.assert_close(out, ref)


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_state(model, snap, new_keys_ok: bool = False) -> bool:
    """Every tensor of `snap` unchanged (and no new tensor unless new_keys_ok: unmerged adapters add theirs)."""
    now = model.state_dict()
    keys_ok = set(now) >= set(snap) if new_keys_ok else set(now) == set(snap)
    return keys_ok and all(torch.equal(now[k], snap[k]) for k in snap)
