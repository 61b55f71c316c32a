"""First-step gradient parity with transformers (fp32, dropout off, small odd configs, a mixed-length padded
batch): loss.backward() through every architecture and head gives each parameter the gradient transformers gives
it (compared through the inverse weight map), on the default backend and on each attention backend."""
from __future__ import annotations

import pytest
import torch

import fastenc
from fastenc import testing
from _train import assert_params_close, base_loss, batch, hf_model

CASES = [("bert", "base"), ("bert", "sequence_classification"), ("bert", "token_classification"),
         ("modernbert", "base"), ("modernbert", "sequence_classification"), ("modernbert", "token_classification"),
         ("vit", "base"), ("vit", "image_classification")]


def _losses(hf, fe, task: str, inputs: dict):
    """(transformers' loss, fastenc's loss) for one batch: the heads' own losses (labels=), or for the base models
    a loss of the last hidden state over real tokens plus one of the pooler output."""
    if task != "base":
        return hf(**inputs).loss, fe(**inputs).loss
    mask = inputs.get("attention_mask")
    ref = hf(**inputs)
    out = fe(**inputs)
    lr, lf = base_loss(ref.last_hidden_state, mask), base_loss(out, mask)
    if getattr(fe, "pooler", None) is not None:
        pooled = fe.pool(out, mask) if mask is not None else fe.pool(out)
        lr, lf = lr + base_loss(ref.pooler_output, None, 1), lf + base_loss(pooled, None, 1)
    return lr, lf


def _check_step(arch: str, task: str, lengths=None, backend: str | None = None) -> None:
    hf = hf_model(arch, task)
    fe = fastenc.from_hf(hf).train()
    assert all(p.requires_grad for p in fe.parameters())
    inputs = batch(arch, task) if lengths is None else batch(arch, task, lengths=lengths)
    with fastenc.use_backend(backend) if backend else torch.enable_grad():
        lr, lf = _losses(hf, fe, task, inputs)
        lr.backward()
        lf.backward()
    lf, lr = lf.item(), lr.item()
    assert abs(lf - lr) <= 1e-5 * abs(lr) + 1e-7, (lf, lr)
    grads = {n: p.grad for n, p in fe.named_parameters()}
    missing = [n for n, g in grads.items() if g is None]
    assert not missing, f"no gradient for {missing}"
    assert_params_close(fe, grads, {n: p.grad for n, p in hf.named_parameters()}, 1e-4, "gradients")


@pytest.mark.parametrize("arch,task", CASES, ids=[f"{a}-{t}" for a, t in CASES])
def test_first_step_gradients_match_transformers(arch, task):
    _check_step(arch, task)


_BACKEND_CASES = [("bert", "sequence_classification"), ("modernbert", "token_classification"),
                  ("vit", "image_classification")]


# The cpu backend is the default of the test above; the others that run on CPU tensors here (the reference, and
# Triton under the interpreter).
_BACKENDS = [b for b in testing.backends_for("attention", "cpu") if b != "cpu"]


@pytest.mark.parametrize("backend", _BACKENDS)
@pytest.mark.parametrize("arch,task", _BACKEND_CASES, ids=[a for a, _ in _BACKEND_CASES])
def test_gradients_on_each_backend(arch, task, backend):
    # Short sequences: the Triton interpreter runs every tile step in Python.
    _check_step(arch, task, lengths=[5, 9, 1], backend=backend)
