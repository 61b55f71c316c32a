"""ViT / DeiT image classification reads the CLS token alone: the last layer runs Wo, its norms and its MLP (and the
final norm) on each image's first row only, after attention over every token. Logits, loss and every parameter's
gradient equal those of the full last layer; transformers' outputs are matched; the base model still returns every
token."""
import pytest
import torch
import torch.nn.functional as F

import fastenc
from tests.models import _models_hf as _hf

# odd sizes: image 36 with patch 12 (9 patches + CLS = 10 tokens), hidden 60, 3 heads
_SMALL = dict(hidden=60, heads=3, image=36, patch=12)


def _hf_model(arch, layers):
    return getattr(_hf, arch)("image_classification", layers=layers, **_SMALL)


def _pixels(n, seed=0):
    return torch.randn(n, 3, 36, 36, generator=torch.Generator().manual_seed(seed))


def _rows_seen(model):
    rows = []
    model.layers[-1].mlp.fc1.register_forward_hook(lambda mod, args, out: rows.append(out.shape[0]))
    return rows


def _full_logits(model, pixels):
    x, batch = model._encode(pixels)
    return model.classifier(batch.first_tokens(x))


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("arch", ["vit", "deit"])
def test_logits_loss_and_gradients_equal_the_full_last_layer(arch, layers):
    hf = _hf_model(arch, layers)
    trimmed, full = fastenc.from_hf(hf).train(), fastenc.from_hf(hf).train()
    pixels = _pixels(5)
    labels = torch.tensor([0, 3, 1, 2, 2])
    rows = _rows_seen(trimmed)
    out = trimmed(pixels, labels=labels)
    assert rows == [5]  # the last MLP saw one row per image
    want = _full_logits(full, pixels)
    torch.testing.assert_close(out.logits, want, rtol=1e-5, atol=1e-5)
    loss = F.cross_entropy(want, labels)
    torch.testing.assert_close(out.loss, loss, rtol=1e-5, atol=1e-6)
    out.loss.backward()
    loss.backward()
    grads = dict(full.named_parameters())
    n = 0
    for name, p in trimmed.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)
        n += 1
    assert n == len(grads)


@pytest.mark.parametrize("arch", ["vit", "deit"])
def test_inference_matches_transformers_and_the_base_model_keeps_every_token(arch):
    hf = _hf_model(arch, 2).eval()
    fe = fastenc.from_hf(hf).eval()
    pixels = _pixels(3, seed=1)
    rows = _rows_seen(fe)
    with torch.no_grad():
        got = fe(pixels)
        want = hf(pixel_values=pixels).logits
    assert rows == [3]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    base = fastenc.from_hf(getattr(_hf, arch)("base", layers=2, **_SMALL)).eval()
    with torch.no_grad():
        assert base(pixels).shape == (3, 10 if arch == "vit" else 11, 60)  # (CLS (+ distillation) + 9 patches)


def test_dropout_training_runs_the_last_layer_on_cls_rows():
    fe = fastenc.from_hf(_hf.vit("image_classification", layers=2, hidden_dropout_prob=0.2,
                                 attention_probs_dropout_prob=0.1, **_SMALL)).train()
    rows = _rows_seen(fe)
    torch.manual_seed(0)
    out = fe(_pixels(4), labels=torch.tensor([0, 1, 2, 3]))
    out.loss.backward()
    assert rows == [4] and out.logits.shape == (4, 4)
    assert all(torch.isfinite(p.grad).all() for p in fe.parameters() if p.grad is not None)


def test_zero_layers_reads_the_cls_row_of_the_embeddings():
    hf = _hf_model("vit", 1)
    fe = fastenc.from_hf(hf).eval()
    fe.layers = torch.nn.ModuleList()
    pixels = _pixels(2, seed=2)
    with torch.no_grad():
        x, batch = fe._encode(pixels)
        torch.testing.assert_close(fe(pixels), fe.classifier(batch.first_tokens(x)), rtol=0, atol=0)
