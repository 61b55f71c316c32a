"""The SigLIP vision tower against transformers (eager attention, random weights, hidden 36, 3 heads, patch 7, image
35, MLP width 65): SiglipVisionModel with and without the attention-pooling head, interpolated positions at other
resolutions, gradients in training, accelerate (outputs, interpolate_pos_encoding, training through transformers'
parameters), save_pretrained / from_pretrained both ways, PEFT LoRA, bad input."""
from __future__ import annotations

import json

import pytest
import torch

import fastenc
import _models_hf as _hf


def _images(n=3, size=35, seed=5, width=None):
    return torch.randn(n, 3, size, width or size, generator=torch.Generator().manual_seed(seed))


def _close(out, ref, tol=1e-4):
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    assert torch.isfinite(out).all()
    err = float((out - ref).detach().abs().max())
    assert err <= tol, f"max abs error {err:.3e} > {tol:.0e}"


@pytest.mark.parametrize("use_head", [True, False], ids=["head", "no_head"])
@pytest.mark.parametrize("act", ["gelu_pytorch_tanh", "gelu"])
def test_parity_fp32(act, use_head):
    hf = _hf.siglip_vision_model(seed=1, hidden_act=act, vision_use_head=use_head)
    fe = fastenc.from_hf(hf)
    assert type(fe).__name__ == "SiglipVisionModel"
    x = _images()
    with torch.no_grad():
        ref, hidden = hf(x), fe(x)
        pooled = fe.pool(hidden)
    _close(hidden, ref.last_hidden_state)
    assert hidden.shape == (3, 25, 36)
    if use_head:
        _close(pooled, ref.pooler_output)
    else:
        assert pooled is None and ref.pooler_output is None


@pytest.mark.parametrize("size", [(35, 35), (42, 42), (28, 49), (40, 37)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_interpolated_positions(size):
    hf = _hf.siglip_vision_model(seed=2)
    fe = fastenc.from_hf(hf)
    x = _images(n=2, size=size[0], width=size[1], seed=3)
    with torch.no_grad():
        ref = hf(x, interpolate_pos_encoding=True)
        hidden = fe(x, interpolate_pos_encoding=True)
        pooled = fe.pool(hidden)
    _close(hidden, ref.last_hidden_state)
    _close(pooled, ref.pooler_output)


def test_training_gradients_match_transformers():
    hf = _hf.siglip_vision_model(seed=4, attention_dropout=0.0).train()
    fe = fastenc.from_hf(hf).train()
    x = _images(seed=6)
    ref, out = hf(x), None
    hidden = fe(x)
    out = fe.pool(hidden)
    target = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    (((ref.pooler_output - target) ** 2).sum() + ref.last_hidden_state.square().mean()).backward()
    (((out - target) ** 2).sum() + hidden.square().mean()).backward()
    mine = dict(fe.named_parameters())
    pairs = {"embeddings.position": hf.embeddings.position_embedding.weight,
             "embeddings.patch.bias": hf.embeddings.patch_embedding.bias,
             "layers.0.attn.Wo.weight": hf.encoder.layers[0].self_attn.out_proj.weight,
             "layers.1.mlp.fc1.bias": hf.encoder.layers[1].mlp.fc1.bias,
             "norm.weight": hf.post_layernorm.weight,
             "head.probe": hf.head.probe,
             "head.in_proj.weight": hf.head.attention.in_proj_weight,
             "head.out_proj.bias": hf.head.attention.out_proj.bias,
             "head.mlp.fc2.weight": hf.head.mlp.fc2.weight}
    for name, t in pairs.items():  # (relative to the largest gradient of the tensor: fp32 sums)
        _close(mine[name].grad.reshape(t.shape), t.grad, 1e-5 * max(1.0, float(t.grad.abs().max())))
    q = hf.encoder.layers[1].self_attn.q_proj.weight.grad
    _close(mine["layers.1.attn.Wqkv.weight"].grad[:36], q, 1e-5 * max(1.0, float(q.abs().max())))


def test_accelerate_same_outputs_and_interpolation():
    hf = _hf.siglip_vision_model(seed=8)
    fast = fastenc.accelerate(hf)
    for x, interp in ((_images(seed=9), False), (_images(seed=10, size=42, width=29), True)):
        with torch.no_grad():
            ref = hf(x, interpolate_pos_encoding=interp)
            out, ran = _hf.ran_fastenc(lambda: fast(x, interpolate_pos_encoding=interp))
        assert ran and type(out) is type(ref) and type(fast).__name__ == type(hf).__name__
        for k in ("last_hidden_state", "pooler_output"):
            _close(getattr(out, k), getattr(ref, k))


def test_accelerate_trains_transformers_parameters():
    hf = _hf.siglip_vision_model(seed=11).train()
    ref = _hf.siglip_vision_model(seed=11).train()
    fast = fastenc.accelerate(hf)
    x = _images(seed=12)
    out, ran = _hf.ran_fastenc(lambda: fast(x).pooler_output)
    assert ran
    (out ** 2).sum().backward()
    (ref(x).pooler_output ** 2).sum().backward()
    mine, theirs = dict(hf.named_parameters()), dict(ref.named_parameters())
    for name in ("head.attention.in_proj_weight", "encoder.layers.0.self_attn.k_proj.weight", "post_layernorm.weight",
                 "embeddings.patch_embedding.weight"):
        _close(mine[name].grad, theirs[name].grad, 1e-5 * max(1.0, float(theirs[name].grad.abs().max())))


@pytest.mark.parametrize("use_head", [True, False], ids=["head", "no_head"])
def test_from_pretrained_and_save_pretrained(tmp_path, use_head):
    hf = _hf.siglip_vision_model(seed=13, vision_use_head=use_head)
    hf.save_pretrained(tmp_path / "hf")
    fe = fastenc.from_pretrained(tmp_path / "hf")
    assert type(fe).__name__ == "SiglipVisionModel"
    x = _images(seed=14)
    with torch.no_grad():
        _close(fe(x), hf(x).last_hidden_state)
    fe.save_pretrained(tmp_path / "fe")
    back = _hf.transformers.SiglipVisionModel.from_pretrained(tmp_path / "fe", attn_implementation="eager").eval()
    assert set(back.state_dict()) == set(hf.state_dict())
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    config = json.loads((tmp_path / "fe" / "config.json").read_text())
    assert config["model_type"] == "siglip_vision_model" and config["hidden_act"] == "gelu_pytorch_tanh"
    assert config["vision_use_head"] is use_head
    assert "attention_probs_dropout_prob" not in config and config["attention_dropout"] == 0.0


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_peft_lora_adapter(tmp_path, merge):
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(_hf.siglip_vision_model(seed=17),
                          LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "fc1"]))
    g = torch.Generator().manual_seed(18)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    peft.save_pretrained(tmp_path)
    fe = fastenc.from_hf(_hf.siglip_vision_model(seed=17))
    x = _images(seed=19)
    with torch.no_grad():
        plain = fe.pool(fe(x))
        fe.load_lora(tmp_path, merge=merge)
        ref, out = peft(x).pooler_output, fe.pool(fe(x))
    assert float((out - plain).abs().max()) > 1e-3
    _close(out, ref)


def test_bad_input():
    fe = fastenc.from_hf(_hf.siglip_vision_model())
    with pytest.raises(ValueError, match=r"give 36 patches, the position table has 25 .*interpolate_pos_encoding"):
        fe(torch.zeros(2, 3, 42, 42))
    with pytest.raises(TypeError, match="pixel_values must be a float tensor, got torch.int64"):
        fe(torch.zeros(2, 3, 35, 35, dtype=torch.long))
    with pytest.raises(ValueError, match=r"pixel_values must be \(batch, 3, height, width\)"):
        fe(torch.zeros(2, 35, 35))
    with pytest.raises(ValueError, match="unsupported activation 'relu6'"):
        fastenc.from_hf(_hf.siglip_vision_model(hidden_act="relu6"))
