"""DINOv2 and DINOv2 with registers against transformers (eager attention, random weights, hidden 36, 3 heads,
patch 7, image 35): both heads with the MLP and the SwiGLU FFN at the config's resolution and at others (the position
table interpolated), the layer scale folded for inference and unfolded for training (loss, gradients, an optimizer
step, eval in between), save_pretrained / from_pretrained both ways in either mode, accelerate (outputs, training
through transformers' parameters), PEFT LoRA, int8, the older checkpoint layout and bad input."""
from __future__ import annotations

import json

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc.models import architecture, dinov2
from fastenc.models.hf import FallbackWarning

ARCHS = ["dinov2", "dinov2_with_registers"]
PREFIX = {"dinov2": "dinov2", "dinov2_with_registers": "dinov2_with_registers"}
SIZES = [(35, 35), (49, 42), (37, 30)]  # the config's; a larger non-square grid; a smaller one with remainders


def _hf_model(arch, task, seed=0, **kw):
    return getattr(_hf, arch)(task, seed=seed, **kw)


def _images(n=3, size=(35, 35), seed=5):
    return torch.randn(n, 3, *size, generator=torch.Generator().manual_seed(seed))


def _close(out, ref, tol=1e-4):
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    assert torch.isfinite(out).all()
    err = float((out - ref).detach().abs().max())
    assert err <= tol, f"max abs error {err:.3e} > {tol:.0e}"


def _encoder(hf, arch):
    return getattr(hf, PREFIX[arch], hf)


@pytest.mark.parametrize("swiglu", [False, True], ids=["mlp", "swiglu"])
@pytest.mark.parametrize("task", ["base", "image_classification"])
@pytest.mark.parametrize("arch", ARCHS)
def test_parity_fp32_at_several_resolutions(arch, task, swiglu):
    hf = _hf_model(arch, task, seed=1, use_swiglu_ffn=swiglu)
    fe = fastenc.from_hf(hf)
    regs = fe.config.num_register_tokens
    assert regs == (3 if arch == "dinov2_with_registers" else 0) and fe.layer_scale_folded
    for i, size in enumerate(SIZES):
        x = _images(size=size, seed=i)
        with torch.no_grad():
            ref, out = hf(x), fe(x)
        if task == "base":
            assert out.shape == (3, 1 + regs + (size[0] // 7) * (size[1] // 7), 36)
            _close(out, ref.last_hidden_state)
            _close(fe.pool(out), ref.pooler_output)
        else:
            _close(out, ref.logits)


@pytest.mark.parametrize("arch", ARCHS)
def test_interpolated_positions_match_transformers(arch):
    hf = _hf_model(arch, "base", seed=2)
    fe = fastenc.from_hf(hf)
    emb = hf.embeddings
    for h, w in SIZES + [(70, 21)]:
        ref = emb.interpolate_pos_encoding(torch.zeros(1, 1 + (h // 7) * (w // 7), 36), h, w)
        _close(fe.embeddings.positions(h, w), ref, 1e-6)
    assert fe.embeddings.positions(35, 35) is fe.embeddings.position  # the table itself at the config's size


@pytest.mark.parametrize("arch", ARCHS)
def test_classifier_reads_cls_and_the_patch_mean_without_registers(arch):
    hf = _hf_model(arch, "image_classification", seed=3)
    fe = fastenc.from_hf(hf)
    x = _images(2, (42, 35))
    with torch.no_grad():
        hidden = dinov2.Dinov2Model.forward(fe, x)
        regs = fe.config.num_register_tokens
        want = fe.classifier(torch.cat([hidden[:, 0], hidden[:, 1 + regs:].mean(1)], 1))
        _close(fe(x), want, 1e-6)
        _close(fe(x), hf(x).logits)


@pytest.mark.parametrize("arch", ARCHS)
def test_layer_scale_is_folded_for_inference_and_unfolded_for_training(arch):
    hf = _hf_model(arch, "image_classification", seed=4)
    fe = fastenc.from_hf(hf)
    hl = _encoder(hf, arch).encoder.layer[1]
    lam1, lam2 = hl.layer_scale1.lambda1, hl.layer_scale2.lambda1
    layer = fe.layers[1]
    # eval: lambda folded into Wo and fc2 (rows of the weight, the bias)
    _close(layer.attn.Wo.weight, hl.attention.o_proj.weight * lam1[:, None], 1e-7)
    _close(layer.mlp.fc2.bias, hl.mlp.fc2.bias * lam2, 1e-7)
    assert torch.equal(layer.ls1, lam1)
    params = dict(fe.named_parameters())
    fe.train()
    assert not fe.layer_scale_folded and dict(fe.named_parameters()) == params  # the same Parameter objects
    _close(layer.attn.Wo.weight, hl.attention.o_proj.weight, 1e-7)
    _close(layer.mlp.fc2.weight, hl.mlp.fc2.weight, 1e-7)
    x = _images(seed=6)
    with torch.no_grad():
        _close(fe(x), hf(x).logits)  # (train mode without dropout: the same function)
    fe.eval()
    assert fe.layer_scale_folded
    _close(layer.attn.Wo.weight, hl.attention.o_proj.weight * lam1[:, None], 1e-7)
    with torch.no_grad():
        _close(fe(x), hf(x).logits)


@pytest.mark.parametrize("swiglu", [False, True], ids=["mlp", "swiglu"])
@pytest.mark.parametrize("arch", ARCHS)
def test_training_loss_gradients_and_a_step_match_transformers(arch, swiglu):
    hf = _hf_model(arch, "image_classification", seed=7, use_swiglu_ffn=swiglu).train()
    fe = fastenc.from_hf(hf).train()
    x, labels = _images(seed=8, size=(42, 49)), torch.tensor([1, 4, 0])
    ref, out = hf(x, labels=labels), fe(x, labels=labels)
    assert type(out).__name__ == "ImageClassifierOutput"
    _close(out.logits, ref.logits)
    _close(out.loss, ref.loss, 1e-5)
    ref.loss.backward()
    out.loss.backward()
    enc = _encoder(hf, arch)
    out_name = "down_proj" if swiglu else "fc2"
    pairs = {"layers.0.ls1": enc.encoder.layer[0].layer_scale1.lambda1,
             "layers.1.ls2": enc.encoder.layer[1].layer_scale2.lambda1,
             "layers.0.attn.Wo.weight": enc.encoder.layer[0].attention.o_proj.weight,
             "layers.1.attn.Wo.bias": enc.encoder.layer[1].attention.o_proj.bias,
             f"layers.0.mlp.{out_name}.weight": getattr(enc.encoder.layer[0].mlp, out_name).weight,
             f"layers.1.mlp.{out_name}.bias": getattr(enc.encoder.layer[1].mlp, out_name).bias,
             "embeddings.position": enc.embeddings.position_embeddings,
             "embeddings.cls_token": enc.embeddings.cls_token,
             "classifier.weight": hf.classifier.weight}
    if arch == "dinov2_with_registers":
        pairs["embeddings.registers"] = enc.embeddings.register_tokens
    mine = dict(fe.named_parameters())
    scale = max(float(t.grad.abs().max()) for t in pairs.values())
    for name, t in pairs.items():
        _close(mine[name].grad, t.grad, 1e-5 * max(scale, 1.0))
    # one SGD step on both: the same model afterwards (eval: folded again)
    for opt in (torch.optim.SGD(hf.parameters(), lr=0.5), torch.optim.SGD(fe.parameters(), lr=0.5)):
        opt.step()
    hf.eval(), fe.eval()
    with torch.no_grad():
        _close(fe(x), hf(x).logits)


@pytest.mark.parametrize("arch", ARCHS)
def test_save_pretrained_round_trips_in_eval_and_train_mode(tmp_path, arch):
    hf = _hf_model(arch, "image_classification", seed=9, use_swiglu_ffn=True)
    hf.save_pretrained(tmp_path / "hf")
    fe = fastenc.from_pretrained(tmp_path / "hf")
    assert type(fe).__name__ == type(hf).__name__
    x = _images(seed=10, size=(28, 42))
    with torch.no_grad():
        ref = hf(x).logits
        _close(fe(x), ref)
    cls = getattr(_hf.transformers, type(hf).__name__)
    for mode in ("eval", "train"):
        getattr(fe, mode)()
        fe.save_pretrained(tmp_path / mode)
        assert fe.layer_scale_folded == (mode == "eval")  # (saving leaves the model as it was)
        back = cls.from_pretrained(tmp_path / mode, attn_implementation="eager").eval()
        assert set(back.state_dict()) == set(hf.state_dict())
        for k, v in hf.state_dict().items():  # the layer-scaled projections within two ulps, the rest exact
            w = back.state_dict()[k]
            assert bool(((w - v).abs() <= 2 * torch.finfo(v.dtype).eps * v.abs()).all()), k
        with torch.no_grad():
            _close(back(x).logits, ref)
            again = fastenc.from_pretrained(tmp_path / mode)
            _close(again(x), ref)
    config = json.loads((tmp_path / "eval" / "config.json").read_text())
    assert config["model_type"] == arch and config["use_swiglu_ffn"] is True
    assert "intermediate_size" not in config and "pooler_act" not in config


@pytest.mark.parametrize("task", ["base", "image_classification"])
@pytest.mark.parametrize("arch", ARCHS)
def test_accelerate_same_outputs(arch, task):
    hf = _hf_model(arch, task, seed=11)
    fast = fastenc.accelerate(hf)
    x = _images(seed=12, size=(42, 35))
    with torch.no_grad():
        ref = hf(x)
        out, ran = _hf.ran_fastenc(lambda: fast(x))
    assert ran and type(out) is type(ref) and type(fast).__name__ == type(hf).__name__
    for k in ("last_hidden_state", "pooler_output") if task == "base" else ("logits",):
        _close(getattr(out, k), getattr(ref, k))
    with pytest.warns(FallbackWarning, match="bool_masked_pos"), torch.no_grad():
        masked = torch.zeros(3, 30, dtype=torch.bool)
        fast(x, bool_masked_pos=masked)


@pytest.mark.parametrize("arch", ARCHS)
def test_accelerate_trains_transformers_parameters(arch):
    hf = _hf_model(arch, "image_classification", seed=13).train()
    ref = _hf_model(arch, "image_classification", seed=13).train()
    fast = fastenc.accelerate(hf)
    x, labels = _images(seed=14), torch.tensor([2, 3, 0])
    out, ran = _hf.ran_fastenc(lambda: fast(x, labels=labels))
    assert ran and fast.__dict__["_fastenc"].layer_scale_folded  # (weights computed per call, folded)
    theirs = ref(x, labels=labels)
    _close(out.loss, theirs.loss, 1e-5)
    out.loss.backward()
    theirs.loss.backward()
    mine, theirs = dict(hf.named_parameters()), dict(ref.named_parameters())
    pre = PREFIX[arch]
    for name in (f"{pre}.encoder.layer.0.layer_scale1.lambda1", f"{pre}.encoder.layer.1.layer_scale2.lambda1",
                 f"{pre}.encoder.layer.1.attention.o_proj.weight", f"{pre}.encoder.layer.0.mlp.fc2.bias"):
        _close(mine[name].grad, theirs[name].grad, 1e-5)


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
@pytest.mark.parametrize("arch", ARCHS)
def test_peft_lora_adapter(tmp_path, arch, merge):
    from peft import LoraConfig, get_peft_model

    targets = list(architecture.get(arch).lora_targets) + ["fc1"]  # (PEFT has no default here)
    peft = get_peft_model(_hf_model(arch, "image_classification", seed=15),
                          LoraConfig(r=4, lora_alpha=8, target_modules=targets, modules_to_save=["classifier"]))
    g = torch.Generator().manual_seed(16)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    peft.save_pretrained(tmp_path)
    fe = fastenc.from_hf(_hf_model(arch, "image_classification", seed=15))
    x = _images(seed=17, size=(42, 42))
    with torch.no_grad():
        plain = fe(x)
        fe.load_lora(tmp_path, merge=merge)
        ref, out = peft(x).logits, fe(x)
    assert float((out - plain).abs().max()) > 1e-3
    _close(out, ref)


@pytest.mark.parametrize("arch", ARCHS)
def test_lora_on_a_layer_scaled_projection_is_refused(arch):
    fe = fastenc.from_hf(_hf_model(arch, "base", seed=18))
    for target in ("o_proj", "fc2"):
        with pytest.raises(ValueError, match=f"target module .*{target}.* layer scale"):
            fe.add_lora(r=2, target_modules=[target])
    assert fe.lora_adapters["unmerged"] == [] and all(p.requires_grad for p in fe.parameters())


@pytest.mark.parametrize("arch", ARCHS)
def test_int8_agrees_with_fp32_at_another_resolution(arch):
    fe = fastenc.from_hf(_hf_model(arch, "base", seed=19))
    x = _images(seed=20, size=(49, 42))
    with torch.inference_mode():
        ref = fe(x)
        fastenc.quantize(fe, "int8")
        got = fe(x)
    rel = float((got - ref).abs().max() / ref.abs().max())
    assert rel < 0.05, rel
    with pytest.raises(RuntimeError, match="int8-quantized"):
        fe.train()
    assert fe.layer_scale_folded


def test_older_checkpoint_layout(tmp_path):
    hf = _hf_model("dinov2", "image_classification", seed=21)
    old = {"attention.q_proj": "attention.attention.query", "attention.k_proj": "attention.attention.key",
           "attention.v_proj": "attention.attention.value", "attention.o_proj": "attention.output.dense"}
    state = {}
    for k, v in hf.state_dict().items():
        for a, b in old.items():
            k = k.replace(a, b)
        state[k] = v.contiguous()
    assert "dinov2.encoder.layer.1.attention.attention.query.weight" in state
    from safetensors.torch import save_file
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({**hf.config.to_dict(),
                                                      "architectures": ["Dinov2ForImageClassification"]}))
    fe = fastenc.from_pretrained(tmp_path)
    x = _images(seed=22)
    with torch.no_grad():
        _close(fe(x), hf(x).logits)


def test_backbone_checkpoint_loads_as_the_encoder(tmp_path):
    cfg = _hf.dinov2("base").config
    hf = _hf._init(_hf.transformers.Dinov2Backbone(cfg), 23)
    hf.save_pretrained(tmp_path)
    fe = fastenc.from_pretrained(tmp_path)
    assert fe.task == "base"
    x = _images(seed=24)
    with torch.no_grad():
        hidden = fe(x)
        _close(hidden[:, 1:].reshape(3, 5, 5, 36).permute(0, 3, 1, 2), hf(x).feature_maps[-1])


def test_bad_input_and_drop_path():
    fe = fastenc.from_hf(_hf_model("dinov2", "image_classification"))
    with pytest.raises(ValueError, match=r"pixel_values must be \(batch, 3, height, width\), got shape \(2, 1, 35, 35\)"):
        fe(torch.zeros(2, 1, 35, 35))
    with pytest.raises(ValueError, match=r"at least 7 x 7 pixels \(patch_size\), got shape \(2, 3, 6, 35\)"):
        fe(torch.zeros(2, 3, 6, 35))
    with pytest.raises(TypeError, match="pixel_values must be a float tensor, got torch.int64"):
        fe(torch.zeros(2, 3, 35, 35, dtype=torch.long))
    with pytest.raises(ValueError, match=r"labels must be class indices in \[0, 5\)"):
        fe(_images(), labels=torch.tensor([0, 5, 1]))
    dp = fastenc.from_hf(_hf_model("dinov2", "base", drop_path_rate=0.1))
    with torch.no_grad():  # a no-op at inference
        dp(_images())
    with pytest.raises(ValueError, match=r"drop_path_rate=0.1 \(stochastic depth\) is not supported in training"):
        dp.train()
    assert not dp.training and dp.layer_scale_folded
    zero = _hf_model("dinov2", "base", seed=25)
    with torch.no_grad():
        zero.encoder.layer[1].layer_scale2.lambda1[3] = 0
    fz = fastenc.from_hf(zero)
    with pytest.raises(ValueError, match=r"layers\.1\.ls2 \(layer scale lambda\) has zero channels"):
        fz.train()
    assert not fz.training and fz.layer_scale_folded
    with pytest.raises(ValueError, match="mlp_ratio must be a positive number"):
        dinov2.Dinov2Config.from_dict({"mlp_ratio": 0})


@pytest.mark.parametrize("arch", ARCHS)
def test_add_lora_trains_and_saves_an_adapter_peft_loads(tmp_path, arch):
    from peft import PeftModel

    fe = fastenc.from_hf(_hf_model(arch, "image_classification", seed=26))
    fe.add_lora(r=4, lora_alpha=8)  # the architecture's targets: q_proj, v_proj (PEFT declares none for DINOv2)
    fe.train()
    assert not fe.layer_scale_folded and not fe.layers[0].ls1.requires_grad
    x, labels = _images(seed=27), torch.tensor([0, 2, 4])
    opt = torch.optim.SGD([p for p in fe.parameters() if p.requires_grad], lr=1.0)
    for _ in range(2):
        opt.zero_grad()
        fe(x, labels=labels).loss.backward()
        opt.step()
    fe.eval()
    fe.save_lora(tmp_path)
    peft = PeftModel.from_pretrained(_hf_model(arch, "image_classification", seed=26), tmp_path).eval()
    with torch.no_grad():
        out, ref = fe(x), peft(x).logits
        plain = _hf_model(arch, "image_classification", seed=26)(x).logits
    assert float((ref - plain).abs().max()) > 1e-3
    _close(out, ref)
