"""The CLIP vision tower against transformers (eager attention, random weights, hidden 36, 3 heads, patch 7, image 35,
MLP width 65): CLIPVisionModel and CLIPVisionModelWithProjection with quick_gelu and exact GELU, gradients in
training, accelerate (outputs, interpolate_pos_encoding falling back, training through transformers' parameters),
save_pretrained / from_pretrained both ways (and the checkpoint layout before transformers 5), PEFT LoRA, bad
input."""
from __future__ import annotations

import json

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc.models.hf import FallbackWarning

TASKS = ["base", "image_embedding"]


def _images(n=3, size=35, seed=5):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _close(out, ref, tol=1e-4):
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    assert torch.isfinite(out).all()
    err = float((out - ref).detach().abs().max())
    assert err <= tol, f"max abs error {err:.3e} > {tol:.0e}"


def _fields(fe, task, x) -> dict:
    if task == "base":
        hidden = fe(x)
        return {"last_hidden_state": hidden, "pooler_output": fe.pool(hidden)}
    return fe.hf_forward(x)


@pytest.mark.parametrize("act", ["quick_gelu", "gelu"])
@pytest.mark.parametrize("task", TASKS)
def test_parity_fp32(task, act):
    hf = _hf.clip_vision_model(task, seed=1, hidden_act=act)
    fe = fastenc.from_hf(hf)
    assert type(fe).__name__ == type(hf).__name__
    x = _images()
    with torch.no_grad():
        ref, out = hf(x), _fields(fe, task, x)
    assert set(out) == ({"last_hidden_state", "pooler_output"} if task == "base"
                        else {"last_hidden_state", "image_embeds"})
    for k, v in out.items():
        _close(v, getattr(ref, k))
    if task == "image_embedding":
        with torch.no_grad():
            _close(fe(x), ref.image_embeds)
        assert ref.image_embeds.shape == (3, 20)


def test_quick_gelu_is_not_exact_gelu():
    # the same weights under the two activations differ: the quick_gelu path is really taken
    x = _images(seed=2)
    with torch.no_grad():
        quick = fastenc.from_hf(_hf.clip_vision_model(seed=3))(x)
        exact = fastenc.from_hf(_hf.clip_vision_model(seed=3, hidden_act="gelu"))(x)
    assert float((quick - exact).abs().max()) > 1e-4


@pytest.mark.parametrize("task", TASKS)
def test_training_gradients_match_transformers(task):
    hf = _hf.clip_vision_model(task, seed=4, attention_dropout=0.0).train()
    fe = fastenc.from_hf(hf).train()
    x = _images(seed=6)
    key = "pooler_output" if task == "base" else "image_embeds"
    ref, out = getattr(hf(x), key), _fields(fe, task, x)[key]
    target = torch.randn(ref.shape, generator=torch.Generator().manual_seed(7))
    ((ref - target) ** 2).sum().backward()
    ((out - target) ** 2).sum().backward()
    enc = hf if task == "base" else hf.vision_model
    mine = dict(fe.named_parameters())
    pairs = {"embeddings.cls_token": enc.embeddings.class_embedding,
             "embeddings.position": enc.embeddings.position_embedding.weight,
             "pre_norm.weight": enc.pre_layrnorm.weight,
             "layers.0.attn.Wo.weight": enc.encoder.layers[0].self_attn.out_proj.weight,
             "layers.1.mlp.fc1.bias": enc.encoder.layers[1].mlp.fc1.bias,
             "post_norm.bias": enc.post_layernorm.bias}
    if task == "image_embedding":
        pairs["visual_projection.weight"] = hf.visual_projection.weight
    for name, t in pairs.items():  # (relative to the largest gradient of the tensor: fp32 sums of ~100)
        _close(mine[name].grad, t.grad, 1e-5 * max(1.0, float(t.grad.abs().max())))
    q = enc.encoder.layers[1].self_attn.q_proj.weight.grad
    _close(mine["layers.1.attn.Wqkv.weight"].grad[:36], q, 1e-5 * max(1.0, float(q.abs().max())))


@pytest.mark.parametrize("task", TASKS)
def test_accelerate_same_outputs_and_fallback(task):
    hf = _hf.clip_vision_model(task, seed=8)
    fast = fastenc.accelerate(hf)
    x = _images(seed=9)
    with torch.no_grad():
        ref = hf(x)
        out, ran = _hf.ran_fastenc(lambda: fast(x))
    assert ran and type(out) is type(ref) and type(fast).__name__ == type(hf).__name__
    keys = ("last_hidden_state", "pooler_output") if task == "base" else ("last_hidden_state", "image_embeds")
    for k in keys:
        _close(getattr(out, k), getattr(ref, k))
    with pytest.warns(FallbackWarning, match="interpolate_pos_encoding"), torch.no_grad():
        big = fast(_images(seed=10, size=42), interpolate_pos_encoding=True)
    assert big.last_hidden_state.shape == (3, 37, 36)


def test_accelerate_trains_transformers_parameters():
    hf = _hf.clip_vision_model("image_embedding", seed=11).train()
    ref = _hf.clip_vision_model("image_embedding", seed=11).train()
    fast = fastenc.accelerate(hf)
    x = _images(seed=12)
    out, ran = _hf.ran_fastenc(lambda: fast(x).image_embeds)
    assert ran
    (out ** 2).sum().backward()
    (ref(x).image_embeds ** 2).sum().backward()
    mine, theirs = dict(hf.named_parameters()), dict(ref.named_parameters())
    for name in ("visual_projection.weight", "vision_model.encoder.layers.0.self_attn.k_proj.weight",
                 "vision_model.pre_layrnorm.weight"):
        _close(mine[name].grad, theirs[name].grad, 1e-5 * max(1.0, float(theirs[name].grad.abs().max())))


@pytest.mark.parametrize("task", TASKS)
def test_from_pretrained_and_save_pretrained(tmp_path, task):
    hf = _hf.clip_vision_model(task, seed=13)
    hf.save_pretrained(tmp_path / "hf")
    fe = fastenc.from_pretrained(tmp_path / "hf")
    assert type(fe).__name__ == type(hf).__name__ and fe.task == task
    x = _images(seed=14)
    with torch.no_grad():
        ref, out = hf(x), _fields(fe, task, x)
    for k, v in out.items():
        _close(v, getattr(ref, k))
    fe.save_pretrained(tmp_path / "fe")
    cls = getattr(_hf.transformers, type(hf).__name__)
    back = cls.from_pretrained(tmp_path / "fe", attn_implementation="eager").eval()
    assert set(back.state_dict()) == set(hf.state_dict())
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    config = json.loads((tmp_path / "fe" / "config.json").read_text())
    assert config["model_type"] == "clip_vision_model" and config["hidden_act"] == "quick_gelu"
    assert "attention_probs_dropout_prob" not in config and config["attention_dropout"] == 0.0


def test_checkpoint_before_transformers_5_loads(tmp_path):
    # CLIPVisionModel held its tower as `vision_model` before transformers 5: every key carries that prefix
    hf = _hf.clip_vision_model("base", seed=15)
    from safetensors.torch import save_file
    save_file({f"vision_model.{k}": v.contiguous() for k, v in hf.state_dict().items()},
              str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({**hf.config.to_dict(), "architectures": ["CLIPVisionModel"]}))
    fe = fastenc.from_pretrained(tmp_path)
    x = _images(seed=16)
    with torch.no_grad():
        _close(fe(x), hf(x).last_hidden_state)


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_peft_lora_adapter(tmp_path, merge):
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(_hf.clip_vision_model("image_embedding", seed=17),
                          LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "fc1"]))
    g = torch.Generator().manual_seed(18)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    peft.save_pretrained(tmp_path)
    fe = fastenc.from_hf(_hf.clip_vision_model("image_embedding", seed=17))
    x = _images(seed=19)
    with torch.no_grad():
        plain = fe(x)
        fe.load_lora(tmp_path, merge=merge)
        ref, out = peft(x).image_embeds, fe(x)
    assert float((out - plain).abs().max()) > 1e-3
    _close(out, ref)


def test_bad_input():
    fe = fastenc.from_hf(_hf.clip_vision_model("image_embedding"))
    with pytest.raises(ValueError, match=r"pixel_values must be \(batch, 3, 35, 35\), got shape \(2, 3, 42, 42\)"):
        fe(torch.zeros(2, 3, 42, 42))
    with pytest.raises(TypeError, match="pixel_values must be a float tensor, got torch.int64"):
        fe.hf_forward(torch.zeros(2, 3, 35, 35, dtype=torch.long))
    with pytest.raises(ValueError, match="unsupported activation 'relu6'"):
        fastenc.from_hf(_hf.clip_vision_model(hidden_act="relu6"))
