"""model.save_pretrained(folder) after training: transformers' from_pretrained loads the folder with the trained
weights and gives fastenc's outputs, for every architecture and head; fastenc.from_pretrained reads it back too."""
from __future__ import annotations

import pytest
import torch

import fastenc
import _models_hf as _hf
from _train import batch, hf_model

CASES = [("bert", "base"), ("bert", "sequence_classification"), ("bert", "token_classification"),
         ("modernbert", "base"), ("modernbert", "sequence_classification"), ("modernbert", "token_classification"),
         ("vit", "base"), ("vit", "image_classification")]


def _outputs(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        out = model(**inputs)
    if isinstance(out, torch.Tensor):
        return out
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("arch,task", CASES, ids=[f"{a}-{t}" for a, t in CASES])
def test_saved_folder_loads_in_transformers_with_the_trained_weights(arch, task, tmp_path):
    hf = hf_model(arch, task)
    fe = fastenc.from_hf(hf).train()
    inputs = batch(arch, task, lengths=[6, 11, 2])
    labels = inputs.pop("labels", None)
    opt = torch.optim.SGD(fe.parameters(), lr=0.5)
    for _ in range(2):  # move every weight away from the transformers model's
        out = fe(**inputs, labels=labels) if labels is not None else fe(**inputs)
        loss = out.loss if labels is not None else out.float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    fe.eval()
    if arch == "bert" and task == "base":
        fe.config.hf_config = None  # the config made from fastenc's own fields
    fe.save_pretrained(tmp_path / "m")
    cls = getattr(_hf.transformers, type(hf).__name__)
    loaded = cls.from_pretrained(tmp_path / "m", attn_implementation="eager").eval()
    mine, theirs = _outputs(fe, inputs), _outputs(loaded, inputs)
    before = _outputs(hf.eval(), inputs)
    mask = inputs.get("attention_mask")
    sel = (lambda t: t[mask.bool()]) if mask is not None and mine.dim() == 3 else (lambda t: t)
    assert float((sel(mine) - sel(before)).abs().max()) > 1e-3  # (training changed the outputs)
    assert float((sel(mine) - sel(theirs)).abs().max()) <= 1e-4
    again = fastenc.from_pretrained(tmp_path / "m")
    assert float((sel(_outputs(again, inputs)) - sel(mine)).abs().max()) <= 1e-5
