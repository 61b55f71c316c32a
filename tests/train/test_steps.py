"""Step-for-step parity with transformers: 20 AdamW steps (fp32, dropout off, fixed seeds, small odd configs,
four mixed-length padded batches in turn) give the same loss at every step and the same final weights.

Key biases are left out of the weight comparison: their gradient is zero in exact arithmetic (a key bias adds the
same q . b to every score of a query, which the softmax cancels), so each side's is rounding noise, which AdamW's
normalization turns into steps of size lr in random directions."""
from __future__ import annotations

import pytest
import torch

import fastenc
from _train import assert_params_close, batch, hf_model

STEPS = 20
CASES = [("bert", "sequence_classification"), ("bert", "token_classification"),
         ("modernbert", "sequence_classification"), ("modernbert", "token_classification"),
         ("vit", "image_classification")]


KEY_BIASES = ("attention.self.key.bias", "attention.k_proj.bias")


def _adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)


@pytest.mark.parametrize("arch,task", CASES, ids=[f"{a}-{t}" for a, t in CASES])
def test_adamw_steps_match_transformers(arch, task):
    hf = hf_model(arch, task)
    fe = fastenc.from_hf(hf).train()
    opt_hf, opt_fe = _adamw(hf), _adamw(fe)
    losses = []
    for step in range(STEPS):
        i = step % 4
        inputs = batch(arch, task, seed=i, lengths=[3 + 7 * i, 1 + 5 * i, 11, 29 - 6 * i])
        for model, opt in ((hf, opt_hf), (fe, opt_fe)):
            opt.zero_grad()
            loss = model(**inputs).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
        ref, got = losses[-2], losses[-1]
        assert abs(got - ref) <= 1e-4 * abs(ref), f"step {step}: loss {got} vs transformers' {ref}"
    assert sum(losses[-8::2]) < sum(losses[:8:2])  # (it trained: the same four batches, lower loss)
    ref = {n: p.detach() for n, p in hf.named_parameters() if not n.endswith(KEY_BIASES)}
    assert_params_close(fe, {n: p.detach() for n, p in fe.named_parameters()}, ref, 1e-4, "weights after 20 steps")
