"""SiglipModel (both towers) and SiglipForImageClassification against transformers (eager attention, random
weights: text tower hidden 36 with a head 48 wide, vision tower hidden 48, 3 heads, patch 7, image 35): the joint
forward (logits with logit_bias, the sigmoid loss) on max_length-padded text without a mask and on left-padded text
with one, interpolated positions, get_*_features, gradients, save_pretrained / from_pretrained both ways,
accelerate, encode (texts padded to max_length as SigLIP's processor pads them; images), the classifier with
labels, PEFT LoRA on both towers, bad input."""
from __future__ import annotations

import json

import pytest
import torch

import fastenc
import _models_hf as _hf

PAD = 1


def _text(lengths, seq=None, seed=0, left=False):
    """ids (batch, seq) in [3, 200) padded with PAD (right, as SigLIP's processor pads to max_length, or left);
    mask (batch, seq) long."""
    g = torch.Generator().manual_seed(seed)
    seq = seq or max(lengths)
    ids = torch.full((len(lengths), seq), PAD, dtype=torch.long)
    mask = torch.zeros(len(lengths), seq, dtype=torch.long)
    for i, n in enumerate(lengths):
        sl = slice(seq - n, seq) if left else slice(0, n)
        ids[i, sl] = torch.randint(3, 200, (n,), generator=g)
        mask[i, sl] = 1
    return ids, mask


def _images(n=3, seed=5, size=35, width=None):
    return torch.randn(n, 3, size, width or size, generator=torch.Generator().manual_seed(seed))


def _close(out, ref, tol=1e-4):
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    assert torch.isfinite(out).all()
    err = float((out - ref).detach().abs().max())
    assert err <= tol, f"max abs error {err:.3e} > {tol:.0e}"


FIELDS = ("logits_per_image", "logits_per_text", "text_embeds", "image_embeds", "loss")


@pytest.mark.parametrize("padding", ["max_length", "left_mask"])
def test_parity_fp32_logits_and_sigmoid_loss(padding):
    hf = _hf.siglip(seed=1)
    fe = fastenc.from_hf(hf)
    assert type(fe).__name__ == "SiglipModel"
    if padding == "max_length":  # (pad tokens, no mask: how SigLIP was trained)
        ids, mask = _text([5, 11, 2], seq=13, seed=2)[0], None
    else:
        ids, mask = _text([5, 11, 2], seq=13, seed=2, left=True)
    x = _images(3, seed=3)
    with torch.no_grad():
        ref = hf(input_ids=ids, pixel_values=x, attention_mask=mask, return_loss=True)
        out = fe(ids, x, mask, return_loss=True)
    for k in FIELDS:
        _close(getattr(out, k), getattr(ref, k))
    assert float(fe.logit_bias.detach().abs()) > 0  # (the bias is part of the logits)
    _close(out.vision_model_output.pooler_output, ref.vision_model_output.pooler_output)


def test_interpolated_positions_and_features():
    hf = _hf.siglip(seed=4)
    fe = fastenc.from_hf(hf)
    ids = _text([6, 9], seq=9, seed=5)[0]
    x = _images(2, seed=6, size=42, width=28)
    with torch.no_grad():
        ref = hf(input_ids=ids, pixel_values=x, interpolate_pos_encoding=True)
        out = fe(ids, x, interpolate_pos_encoding=True)
        rt, ft = hf.get_text_features(ids), fe.get_text_features(ids)
        ri, fi = hf.get_image_features(_images(2, seed=7)), fe.get_image_features(_images(2, seed=7))
    _close(out.logits_per_text, ref.logits_per_text)
    _close(ft.pooler_output, rt.pooler_output)
    _close(ft.last_hidden_state, rt.last_hidden_state)
    _close(fi.pooler_output, ri.pooler_output)


def test_training_gradients_of_the_sigmoid_loss():
    hf = _hf.siglip(seed=8).train()
    fe = fastenc.from_hf(hf).train()
    ids = _text([4, 8, 8], seq=8, seed=9)[0]
    x = _images(3, seed=10)
    hf(input_ids=ids, pixel_values=x, return_loss=True).loss.backward()
    fe(ids, x, return_loss=True).loss.backward()
    mine = dict(fe.named_parameters())
    pairs = {"logit_scale": hf.logit_scale, "logit_bias": hf.logit_bias,
             "text_model.head.weight": hf.text_model.head.weight,
             "text_model.layers.0.mlp.fc2.bias": hf.text_model.encoder.layers[0].mlp.fc2.bias,
             "vision_model.head.probe": hf.vision_model.head.probe,
             "vision_model.layers.1.attn.Wo.weight": hf.vision_model.encoder.layers[1].self_attn.out_proj.weight,
             "vision_model.embeddings.patch.bias": hf.vision_model.embeddings.patch_embedding.bias}
    for name, t in pairs.items():
        _close(mine[name].grad.reshape(t.shape), t.grad, 1e-5 * max(1.0, float(t.grad.abs().max())))


def test_from_pretrained_save_pretrained_and_accelerate(tmp_path):
    hf = _hf.siglip(seed=11)
    hf.save_pretrained(tmp_path / "hf")
    fe = fastenc.from_pretrained(tmp_path / "hf")
    ids = _text([3, 7], seq=7, seed=12)[0]
    x = _images(2, seed=13)
    with torch.no_grad():
        ref = hf(input_ids=ids, pixel_values=x, return_loss=True)
        _close(fe(ids, x).logits_per_image, ref.logits_per_image)
    fe.save_pretrained(tmp_path / "fe")
    back = _hf.transformers.SiglipModel.from_pretrained(tmp_path / "fe", attn_implementation="eager").eval()
    assert set(back.state_dict()) == set(hf.state_dict())
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    config = json.loads((tmp_path / "fe" / "config.json").read_text())
    assert config["model_type"] == "siglip" and "projection_dim" not in config
    assert config["text_config"]["projection_size"] == 48 and config["vision_config"]["vision_use_head"] is True
    fast = fastenc.accelerate(hf)
    with torch.no_grad():
        out, ran = _hf.ran_fastenc(lambda: fast(input_ids=ids, pixel_values=x, return_loss=True))
        ft, ran_t = _hf.ran_fastenc(lambda: fast.get_text_features(input_ids=ids))
    assert ran and ran_t and type(out) is type(ref) and type(ft).__name__ == "BaseModelOutputWithPooling"
    for k in FIELDS:
        _close(getattr(out, k), getattr(ref, k))
    _close(ft.pooler_output, ref.text_model_output.pooler_output)


def test_encode_pads_texts_to_max_length():
    """encode(token lists) pads each to max_length with the pad id (SigLIP's processor, padding="max_length"),
    the model's text embedding = get_text_features' pooler_output, for SiglipModel and the text tower alike."""
    hf = _hf.siglip(seed=14)
    fe = fastenc.from_hf(hf)
    tower = fastenc.from_hf(hf.text_model)
    assert type(tower).__name__ == "SiglipTextModel"
    seqs = [[5, 17, 90], [7] * 12, [33]]
    ids = torch.tensor([s + [PAD] * (16 - len(s)) for s in seqs])
    with torch.no_grad():
        ref = hf.get_text_features(ids).pooler_output
    _close(fe.encode(seqs, max_length=16, batch_size=2), ref)
    _close(tower.encode(seqs, max_length=16), ref)
    _close(fe.encode(images=_images(3, seed=15)), hf.get_image_features(_images(3, seed=15)).pooler_output)
    ids, mask = _text([4, 6], seed=16)  # (right padding under a mask: the pooled last column is padding)
    with pytest.raises(ValueError, match="padding in the last column"):
        tower.encode(ids, mask)


@pytest.mark.parametrize("num_labels", [3, 1])
def test_image_classification_with_labels(num_labels):
    hf = _hf.siglip("image_classification", seed=17, num_labels=num_labels)
    fe, _, _ = _hf.image_classifier_step(hf, "SiglipForImageClassification", _images(4, seed=18), num_labels, 19,
                                         _close)
    mine = dict(fe.named_parameters())
    for name, t in {"classifier.weight": hf.classifier.weight,
                    "vision_model.layers.0.attn.Wqkv.weight": None,
                    "vision_model.norm.weight": hf.vision_model.post_layernorm.weight}.items():
        if t is None:
            t = hf.vision_model.encoder.layers[0].self_attn.q_proj.weight
            _close(mine[name].grad[:48], t.grad, 1e-5 * max(1.0, float(t.grad.abs().max())))
            continue
        _close(mine[name].grad, t.grad, 1e-5 * max(1.0, float(t.grad.abs().max())))
    with torch.no_grad():
        _close(fe.eval()(_images(2, seed=20, size=42), interpolate_pos_encoding=True),
               hf.eval()(_images(2, seed=20, size=42), interpolate_pos_encoding=True).logits)


def test_image_classification_save_and_accelerate(tmp_path):
    hf = _hf.siglip("image_classification", seed=21)
    fe = fastenc.from_hf(hf)
    fe.save_pretrained(tmp_path)
    back = _hf.transformers.SiglipForImageClassification.from_pretrained(tmp_path, attn_implementation="eager")
    assert set(back.state_dict()) == set(hf.state_dict())
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    again = fastenc.from_pretrained(tmp_path)
    x = _images(2, seed=22)
    labels = torch.tensor([2, 0])
    with torch.no_grad():
        ref = hf(x, labels=labels)
        _close(again(x), ref.logits)
        out, ran = _hf.ran_fastenc(lambda: fastenc.accelerate(hf)(x, labels=labels))
    assert ran and type(out) is type(ref)
    _close(out.logits, ref.logits)
    _close(out.loss, ref.loss)


def test_bad_input():
    fe = fastenc.from_hf(_hf.siglip(seed=23))
    ids, mask = _text([4, 6], seed=24)
    with pytest.raises(ValueError, match="padding in the last column"):
        fe(ids, _images(2), mask)
    with pytest.raises(ValueError, match="return_loss=True pairs text i with image i"):
        fe(ids, _images(3), return_loss=True)
    with pytest.raises(ValueError, match="interpolate_pos_encoding=True to resize it"):
        fe(ids, _images(2, size=42))
    from fastenc.models.siglip import SiglipConfig, SiglipForImageClassification

    cfg = SiglipConfig.from_dict(_hf.siglip("image_classification").config.to_dict(), num_labels=0)
    clf = SiglipForImageClassification(cfg)
    assert clf.classifier is None
    with pytest.raises(ValueError, match="labels need a classifier"):
        clf(_images(2), labels=torch.tensor([0, 1]))


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_peft_lora_adapter_on_both_towers(tmp_path, merge):
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(_hf.siglip(seed=30), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "fc1"]))
    g = torch.Generator().manual_seed(31)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    peft.save_pretrained(tmp_path)
    fe = fastenc.from_hf(_hf.siglip(seed=30))
    ids = _text([9, 9], seed=33)[0]
    x = _images(2, seed=32)
    with torch.no_grad():
        plain = fe(ids, x).logits_per_text
        fe.load_lora(tmp_path, merge=merge)
        ref, out = peft(input_ids=ids, pixel_values=x).logits_per_text, fe(ids, x).logits_per_text
    assert float((out - plain).abs().max()) > 1e-2
    _close(out, ref)
