"""Helpers of the training tests: small transformers models with dropout off, a mixed-length padded batch with
labels for each head, and the per-parameter comparison of gradients / weights through the inverse weight map."""
from __future__ import annotations

import torch

import _models_hf as _hf
from fastenc.models import architecture, convert
from fastenc.models.loading import SUPPORTED

NO_DROP = {"bert": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
           "modernbert": {}, "vit": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)}
LENGTHS = [13, 70, 1, 37]  # mixed lengths, one past ModernBERT's 64-token half window
IMAGE = dict(image=40, patch=8)  # 25 patches + CLS


def hf_model(arch: str, task: str, seed: int = 0, **kw):
    """A small random transformers model in training mode, dropout off unless kw sets it."""
    args = {**NO_DROP[arch], **kw}
    if arch == "bert":
        m = _hf.bert(task, hidden=48, heads=3, layers=2, seed=seed, **args)
    elif arch == "modernbert":
        m = _hf.modernbert(task, hidden=48, heads=3, layers=3, seed=seed, **args)
    else:
        m = _hf.vit(task, hidden=48, heads=3, layers=2, seed=seed, **IMAGE, **args)
    return m.train()


def batch(arch: str, task: str, seed: int = 0, lengths=LENGTHS) -> dict:
    """Inputs with labels for (arch, task): padded text (labels -100 at padding) or images."""
    g = torch.Generator().manual_seed(1000 + seed)
    if arch == "vit":
        pv = torch.randn(3, 3, IMAGE["image"], IMAGE["image"], generator=g)
        out = {"pixel_values": pv}
        if task != "base":
            out["labels"] = torch.randint(0, 4, (3,), generator=g)
        return out
    ids, mask, types = _hf.text_batch(lengths, seed=seed)
    out = {"input_ids": ids, "attention_mask": mask}
    if arch == "bert":
        out["token_type_ids"] = types
    n = 5 if arch == "bert" else 3
    if task == "sequence_classification":
        out["labels"] = torch.randint(0, n, (len(lengths),), generator=g)
    elif task == "token_classification":
        lab = torch.randint(0, n, ids.shape, generator=g)
        out["labels"] = lab.masked_fill(mask == 0, -100)
    return out


def base_loss(hidden: torch.Tensor, mask: torch.Tensor | None, seed: int = 0) -> torch.Tensor:
    """A loss of the base models' last hidden state over real tokens: a fixed random projection, squared."""
    w = torch.randn(hidden.shape[-1], generator=torch.Generator().manual_seed(seed))
    y = (hidden @ w) ** 2
    return (y if mask is None else y * mask).sum() / y.numel()


def hf_names(fe_model, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """fastenc-named tensors (parameters or their gradients) under transformers' names (the inverse map)."""
    entries = architecture.of_model(fe_model).entries(fe_model.config, fe_model.task)
    return convert.fastenc_to_hf(entries, tensors, fe_model.config)


def assert_params_close(fe_model, fe_tensors: dict, hf_tensors: dict, rtol: float, what: str) -> None:
    """Every transformers tensor has its fastenc counterpart within rtol of the tensor's own max magnitude (a floor
    of 1e-3 of the largest over all tensors, for tensors that are exactly zero in theory, like key biases' grads)."""
    mine = hf_names(fe_model, fe_tensors)
    scale = max(float(t.abs().max()) for t in hf_tensors.values() if t is not None)
    bad = []
    for name, ref in hf_tensors.items():
        if ref is None:
            continue
        got = mine.get(name)
        assert got is not None, f"{what}: no fastenc value for {name}"
        assert torch.isfinite(got).all(), f"{what}: {name} not finite"
        err = float((got - ref).abs().max())
        lim = rtol * max(float(ref.abs().max()), 1e-3 * scale)
        if err > lim:
            bad.append(f"{name}: {err:.3e} > {lim:.3e}")
    assert not bad, f"{what} differ: " + "; ".join(bad[:6])


def kind(hf_model) -> tuple[str, str]:
    return SUPPORTED[type(hf_model).__name__]
