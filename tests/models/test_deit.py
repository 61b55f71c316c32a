"""DeiT against transformers (eager attention, random weights): every head in fp32 and bf16, the loss, the
distilled head's three outputs, accelerate (and an image-classification pipeline on it), from_pretrained /
save_pretrained folders, the masked-image-modeling checkpoint as the encoder, the older checkpoint layout and bad
checkpoints."""
from __future__ import annotations

import json

import pytest
import torch

import fastenc
import _models_hf as _hf
from fastenc import testing
from fastenc.models.hf import FallbackWarning

TASKS = ["base", "image_classification", "image_classification_with_teacher"]
SMALL = dict(hidden=48, heads=3, layers=2, image=40, patch=8)  # 25 patches + [CLS] + distillation = 27 tokens
FIELDS = {"base": ("last_hidden_state", "pooler_output"), "image_classification": ("logits",),
          "image_classification_with_teacher": ("logits", "cls_logits", "distillation_logits")}


def _images(n=3, size=40, seed=5):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _close(out, ref, tol=1e-4):
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    assert torch.isfinite(out).all()
    err = float((out - ref).detach().abs().max())
    assert err <= tol, f"max abs error {err:.3e} > {tol:.0e}"


@pytest.mark.parametrize("task", TASKS)
def test_parity_fp32(task):
    hf = _hf.deit(task, **SMALL, seed=1)
    fe = fastenc.from_hf(hf)
    x = _images()
    with torch.no_grad():
        ref = hf(x)
        out = fe(x)
    if task == "base":
        assert out.shape == (3, 27, 48)
        _close(out, ref.last_hidden_state)
        _close(fe.pool(out), ref.pooler_output)
        return
    _close(out, ref.logits)
    if task == "image_classification_with_teacher":
        with torch.no_grad():
            fields = fe.hf_forward(x)
        assert set(fields) == set(FIELDS[task])
        for k in FIELDS[task]:
            _close(fields[k], getattr(ref, k))
        # the two heads differ: an average of one classifier twice would not match both
        assert float((fields["cls_logits"] - fields["distillation_logits"]).abs().max()) > 1e-2


def test_distillation_token_and_positions_are_read():
    hf = _hf.deit("image_classification_with_teacher", **SMALL, seed=2)
    fe = fastenc.from_hf(hf)
    assert fe.embeddings.position.shape == (1, 27, 48)
    assert torch.equal(fe.embeddings.distillation_token, hf.deit.embeddings.distillation_token)
    x = _images(2)
    with torch.no_grad():
        before = fe.hf_forward(x)["distillation_logits"]
        shift = torch.randn(48, generator=torch.Generator().manual_seed(0))  # (not constant: the norms remove that)
        fe.embeddings.distillation_token.add_(shift)
        hf.deit.embeddings.distillation_token.add_(shift)
        after, ref = fe.hf_forward(x)["distillation_logits"], hf(x).distillation_logits
    assert float((after - before).abs().max()) > 1e-3
    _close(after, ref)


def test_no_pooler_no_qkv_bias():
    hf = _hf._init(_hf.transformers.DeiTModel(_hf.transformers.DeiTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=40, image_size=24,
        patch_size=8, qkv_bias=False, attn_implementation="eager"), add_pooling_layer=False), 3)
    fe = fastenc.from_hf(hf)
    assert fe.pooler is None and fe.layers[0].attn.Wqkv.bias is None
    x = _images(2, 24)
    with torch.no_grad():
        _close(fe(x), hf(x).last_hidden_state)


@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=["bf16"])
def test_low_precision_to(dtype):
    # every head's output within the tolerance rule against transformers' own error in the same dtype
    x = _images(seed=8)
    for task in ("base", "image_classification_with_teacher"):
        hf = _hf.deit(task, **SMALL, seed=4)
        with torch.no_grad():
            ref32 = hf(x)[0]
            ref_lowp = _hf.deit(task, **SMALL, seed=4).to(dtype)(x.to(dtype))[0]
            fe = fastenc.from_hf(hf).to(dtype=dtype)
            out = fe(x.to(dtype))
        assert out.dtype == dtype and fe.embeddings.distillation_token.dtype == dtype
        testing.assert_close(out.float(), ref32, ref_lowp.float(), dtype=dtype)


@pytest.mark.parametrize("problem", ["single_label_classification", "multi_label_classification"])
def test_image_classification_loss_and_gradients(problem):
    hf = _hf.deit("image_classification", **SMALL, seed=6)
    fe = fastenc.from_hf(hf)
    x = _images(seed=9)
    g = torch.Generator().manual_seed(2)
    labels = (torch.randint(0, 4, (3,), generator=g) if problem == "single_label_classification"
              else torch.randint(0, 2, (3, 4), generator=g).float())
    ref = hf(x, labels=labels)
    out = fe(x, labels=labels)
    assert type(out).__name__ == "ImageClassifierOutput" and fe.config.problem_type == problem
    _close(out.logits, ref.logits)
    _close(out.loss, ref.loss, 1e-5)
    ref.loss.backward()
    out.loss.backward()
    _close(fe.embeddings.distillation_token.grad, hf.deit.embeddings.distillation_token.grad, 1e-5)
    _close(fe.classifier.weight.grad, hf.classifier.weight.grad, 1e-5)
    with pytest.raises(ValueError, match=r"labels must be class indices in \[0, 4\)"):
        fastenc.from_hf(_hf.deit("image_classification", **SMALL))(x, labels=torch.tensor([0, 4, 1]))


def test_bad_pixel_values():
    fe = fastenc.from_hf(_hf.deit("image_classification_with_teacher", **SMALL))
    with pytest.raises(ValueError, match=r"pixel_values must be \(batch, 3, 40, 40\), got shape \(2, 3, 32, 32\)"):
        fe(torch.zeros(2, 3, 32, 32))
    with pytest.raises(TypeError, match="pixel_values must be a float tensor, got torch.int64"):
        fe.hf_forward(torch.zeros(2, 3, 40, 40, dtype=torch.long))


@pytest.mark.parametrize("task", TASKS)
def test_accelerate_same_outputs(task):
    hf = _hf.deit(task, **SMALL, seed=7)
    fast = fastenc.accelerate(hf)
    x = _images(seed=10)
    with torch.no_grad():
        ref = hf(x)
        out, ran = _hf.ran_fastenc(lambda: fast(x))
    assert ran and type(out) is type(ref) and type(fast).__name__ == type(hf).__name__
    for k in FIELDS[task]:
        _close(getattr(out, k), getattr(ref, k))
    with torch.no_grad():
        tup = fast(x, return_dict=False)
    _close(tup[0], out[0])
    with pytest.warns(FallbackWarning, match="interpolate_pos_encoding"), torch.no_grad():
        again = fast(_images(seed=10), interpolate_pos_encoding=True)
    _close(again[0], ref[0])


def test_accelerate_trains_transformers_parameters():
    hf = _hf.deit("image_classification", **SMALL, seed=12)
    ref = _hf.deit("image_classification", **SMALL, seed=12)
    fast = fastenc.accelerate(hf)
    x, labels = _images(seed=13), torch.tensor([1, 3, 0])
    out, ran = _hf.ran_fastenc(lambda: fast(x, labels=labels))
    assert ran
    out.loss.backward()
    ref(x, labels=labels).loss.backward()
    token = "deit.embeddings.distillation_token"
    _close(dict(hf.named_parameters())[token].grad, dict(ref.named_parameters())[token].grad, 1e-5)


def test_pipeline_on_accelerate_same_labels_and_scores():
    import numpy as np
    from PIL import Image
    from transformers import pipeline
    from transformers.models.deit.image_processing_pil_deit import DeiTImageProcessorPil

    proc = DeiTImageProcessorPil(size={"height": 40, "width": 40}, crop_size={"height": 40, "width": 40})
    rng = np.random.RandomState(0)
    images = [Image.fromarray((rng.rand(30 + 7 * i, 44, 3) * 255).astype("uint8")) for i in range(3)]
    for task in ("image_classification", "image_classification_with_teacher"):
        hf = _hf.deit(task, **SMALL, seed=14, id2label={0: "cat", 1: "dog", 2: "owl", 3: "eel"})
        ref = pipeline("image-classification", model=hf, image_processor=proc, top_k=None)(images)
        fast = fastenc.accelerate(hf)
        got, ran = _hf.ran_fastenc(lambda: pipeline("image-classification", model=fast, image_processor=proc,
                                                     top_k=None)(images))
        assert ran
        for r, o in zip(ref, got):
            assert [d["label"] for d in r] == [d["label"] for d in o]
            _close(torch.tensor([d["score"] for d in o]), torch.tensor([d["score"] for d in r]), 1e-5)


@pytest.mark.parametrize("task", TASKS)
def test_from_pretrained_and_save_pretrained(tmp_path, task):
    hf = _hf.deit(task, **SMALL, seed=15)
    hf.save_pretrained(tmp_path / "hf")
    fe = fastenc.from_pretrained(tmp_path / "hf")
    assert type(fe).__name__ == type(hf).__name__ and fe.task == task
    x = _images(seed=16)
    with torch.no_grad():
        ref, out = hf(x), fe(x)
        _close(out, ref[0])
    fe.save_pretrained(tmp_path / "fe")
    cls = getattr(_hf.transformers, type(hf).__name__)
    back = cls.from_pretrained(tmp_path / "fe", attn_implementation="eager").eval()
    assert set(back.state_dict()) == set(hf.state_dict())
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    assert json.loads((tmp_path / "fe" / "config.json").read_text())["model_type"] == "deit"


def test_masked_image_modeling_checkpoint_loads_as_the_encoder(tmp_path):
    cfg = _hf.transformers.DeiTConfig(hidden_size=48, num_hidden_layers=1, num_attention_heads=3,
                                      intermediate_size=96, image_size=40, patch_size=8, encoder_stride=8,
                                      attn_implementation="eager")
    hf = _hf._init(_hf.transformers.DeiTForMaskedImageModeling(cfg), 17)
    hf.save_pretrained(tmp_path)
    fe = fastenc.from_pretrained(tmp_path)
    assert fe.task == "base" and fe.pooler is None
    x = _images(seed=18)
    with torch.no_grad():
        _close(fe(x), hf.deit(x).last_hidden_state)


def test_older_checkpoint_layout(tmp_path):
    hf = _hf.deit("image_classification_with_teacher", **SMALL, seed=19)
    old = {".layers.": ".encoder.layer.", "attention.q_proj": "attention.attention.query",
           "attention.k_proj": "attention.attention.key", "attention.v_proj": "attention.attention.value",
           "attention.o_proj": "attention.output.dense", "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}
    state = {}
    for k, v in hf.state_dict().items():
        for a, b in old.items():
            k = k.replace(a, b)
        state[k] = v.contiguous()
    assert "deit.encoder.layer.1.attention.attention.query.weight" in state
    from safetensors.torch import save_file
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({**hf.config.to_dict(),
                                                      "architectures": ["DeiTForImageClassificationWithTeacher"]}))
    fe = fastenc.from_pretrained(tmp_path)
    x = _images(seed=20)
    with torch.no_grad():
        _close(fe(x), hf(x).logits)


def test_wrong_position_table_names_the_tensor(tmp_path):
    hf = _hf.deit("base", **SMALL)
    hf.save_pretrained(tmp_path)
    from safetensors.torch import load_file, save_file
    state = load_file(str(tmp_path / "model.safetensors"))
    state["embeddings.position_embeddings"] = state["embeddings.position_embeddings"][:, :26].contiguous()  # ViT's
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"weight embeddings\.position_embeddings must have shape \(1, 27, 48\), "
                                         r"got \(1, 26, 48\)"):
        fastenc.from_pretrained(tmp_path)
    del state["embeddings.distillation_token"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing weights: \['embeddings\.distillation_token'\]"):
        fastenc.from_pretrained(tmp_path)


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_peft_adapter_on_the_distilled_head(tmp_path, merge):
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(_hf.deit("image_classification_with_teacher", **SMALL, seed=21),
                          LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                     modules_to_save=["cls_classifier", "distillation_classifier"]))
    g = torch.Generator().manual_seed(22)
    with torch.no_grad():  # non-zero adapters and changed head copies, so each one shows in the output
        for name, p in peft.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    peft.save_pretrained(tmp_path)
    fe = fastenc.from_hf(_hf.deit("image_classification_with_teacher", **SMALL, seed=21))
    x = _images(seed=23)
    with torch.no_grad():
        plain = fe.hf_forward(x)["logits"]
        fe.load_lora(tmp_path, merge=merge)
        ref, out = peft(x), fe.hf_forward(x)
    assert float((out["logits"] - plain).abs().max()) > 1e-3
    for k in FIELDS["image_classification_with_teacher"]:
        _close(out[k], getattr(ref, k))
