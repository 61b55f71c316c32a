"""CLIPModel (both towers) against transformers (eager attention, random weights: text tower hidden 36, vision tower
hidden 48, 3 heads, patch 7, image 35, projection 20): the joint forward (logits, normalized embeddings, the
contrastive loss) with right-padded text, get_text_features / get_image_features (transformers 5's
BaseModelOutputWithPooling fields), gradients of the loss in training, save_pretrained / from_pretrained both ways,
accelerate (forward, get_*_features, training through transformers' parameters), encode of texts and images, PEFT
LoRA on both towers, the text towers' encode (the model's own text embedding, as sentence-transformers' CLIP module takes it), bad input;
CLIPForImageClassification: logits and the loss with labels, every gradient in training, save_pretrained /
from_pretrained both ways, accelerate, bad input."""
from __future__ import annotations

import json

import pytest
import torch

import fastenc
import _models_hf as _hf

EOS = 210


def _text(lengths, seq=None, seed=0):
    """Right-padded ids (batch, seq) in [3, 200), each sequence ending with EOS, padded with EOS as CLIP's
    tokenizer pads; mask (batch, seq) long."""
    g = torch.Generator().manual_seed(seed)
    seq = seq or max(lengths)
    ids = torch.full((len(lengths), seq), EOS, dtype=torch.long)
    mask = torch.zeros(len(lengths), seq, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n - 1] = torch.randint(3, 200, (n - 1,), generator=g)
        mask[i, :n] = 1
    return ids, mask


def _images(n=3, seed=5):
    return torch.randn(n, 3, 35, 35, generator=torch.Generator().manual_seed(seed))


def _close(out, ref, tol=1e-4):
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    assert torch.isfinite(out).all()
    err = float((out - ref).detach().abs().max())
    assert err <= tol, f"max abs error {err:.3e} > {tol:.0e}"


def _real(hidden, mask):
    return hidden[mask.bool()]


FIELDS = ("logits_per_image", "logits_per_text", "text_embeds", "image_embeds")


def test_parity_fp32_logits_embeddings_and_loss():
    hf = _hf.clip(seed=1)
    fe = fastenc.from_hf(hf)
    assert type(fe).__name__ == "CLIPModel" and fe.task == "base"
    ids, mask = _text([7, 2, 13], seq=15, seed=2)
    x = _images(3, seed=3)
    with torch.no_grad():
        ref = hf(input_ids=ids, pixel_values=x, attention_mask=mask, return_loss=True)
        out = fe(ids, x, mask, return_loss=True)
    for k in FIELDS:
        _close(getattr(out, k), getattr(ref, k))
    _close(out.loss, ref.loss)
    assert out.logits_per_image.shape == (3, 3) and out.text_embeds.shape == (3, 20)
    _close(out.text_embeds.norm(dim=-1), torch.ones(3), 1e-5)
    _close(out.text_model_output.pooler_output, ref.text_model_output.pooler_output)
    _close(out.vision_model_output.last_hidden_state, ref.vision_model_output.last_hidden_state)
    with torch.no_grad():  # more images than texts; no loss asked
        ref = hf(input_ids=ids[:2], pixel_values=_images(5, seed=4), attention_mask=mask[:2])
        out = fe(ids[:2], _images(5, seed=4), mask[:2])
    assert out.loss is None and out.logits_per_image.shape == (5, 2)
    _close(out.logits_per_text, ref.logits_per_text)


def test_get_text_and_image_features_as_transformers():
    hf = _hf.clip(seed=6)
    fe = fastenc.from_hf(hf)
    ids, mask = _text([9, 4, 11, 1], seed=7)
    x = _images(2, seed=8)
    with torch.no_grad():
        rt, ri = hf.get_text_features(ids, attention_mask=mask), hf.get_image_features(x)
        ft, fi = fe.get_text_features(ids, mask), fe.get_image_features(x)
    assert type(rt).__name__ == "BaseModelOutputWithPooling"  # (transformers 5: an output, not a tensor)
    _close(ft.pooler_output, rt.pooler_output)
    _close(_real(ft.last_hidden_state, mask), _real(rt.last_hidden_state, mask))
    _close(fi.pooler_output, ri.pooler_output)
    _close(fi.last_hidden_state, ri.last_hidden_state)
    assert ft.pooler_output.shape == (4, 20) and fi.pooler_output.shape == (2, 20)


def test_training_gradients_of_the_contrastive_loss():
    hf = _hf.clip(seed=9).train()
    fe = fastenc.from_hf(hf).train()
    ids, mask = _text([6, 10, 3], seed=10)
    x = _images(3, seed=11)
    hf(input_ids=ids, pixel_values=x, attention_mask=mask, return_loss=True).loss.backward()
    out = fe(ids, x, mask, return_loss=True)
    out.loss.backward()
    mine = dict(fe.named_parameters())
    pairs = {"logit_scale": hf.logit_scale, "text_projection.weight": hf.text_projection.weight,
             "visual_projection.weight": hf.visual_projection.weight,
             "text_model.embeddings.word.weight": hf.text_model.embeddings.token_embedding.weight,
             "text_model.layers.1.mlp.fc1.bias": hf.text_model.encoder.layers[1].mlp.fc1.bias,
             "text_model.norm.weight": hf.text_model.final_layer_norm.weight,
             "vision_model.embeddings.cls_token": hf.vision_model.embeddings.class_embedding,
             "vision_model.layers.0.attn.Wo.weight": hf.vision_model.encoder.layers[0].self_attn.out_proj.weight,
             "vision_model.post_norm.weight": hf.vision_model.post_layernorm.weight}
    for name, t in pairs.items():
        assert mine[name].grad is not None, name
        _close(mine[name].grad.reshape(t.shape), t.grad, 1e-5 * max(1.0, float(t.grad.abs().max())))


def test_from_pretrained_and_save_pretrained(tmp_path):
    hf = _hf.clip(seed=12)
    hf.save_pretrained(tmp_path / "hf")
    fe = fastenc.from_pretrained(tmp_path / "hf")
    assert type(fe).__name__ == "CLIPModel"
    ids, mask = _text([5, 8], seed=13)
    x = _images(2, seed=14)
    with torch.no_grad():
        _close(fe(ids, x, mask).logits_per_text, hf(input_ids=ids, pixel_values=x, attention_mask=mask).logits_per_text)
    fe.save_pretrained(tmp_path / "fe")
    back = _hf.transformers.CLIPModel.from_pretrained(tmp_path / "fe", attn_implementation="eager").eval()
    assert set(back.state_dict()) == set(hf.state_dict())
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    config = json.loads((tmp_path / "fe" / "config.json").read_text())
    assert config["model_type"] == "clip" and config["architectures"] == ["CLIPModel"]
    assert config["projection_dim"] == 20
    assert config["text_config"]["model_type"] == "clip_text_model" and config["text_config"]["eos_token_id"] == EOS
    assert config["vision_config"]["hidden_size"] == 48 and config["vision_config"]["patch_size"] == 7
    assert "attention_probs_dropout_prob" not in config["text_config"]
    assert back.config.text_config.hidden_size == 36 and back.config.vision_config.image_size == 35


def test_accelerate_forward_and_features():
    hf = _hf.clip(seed=15)
    fast = fastenc.accelerate(hf)
    ids, mask = _text([8, 3, 12], seed=16)
    x = _images(3, seed=17)
    with torch.no_grad():
        ref = hf(input_ids=ids, pixel_values=x, attention_mask=mask, return_loss=True)
        out, ran = _hf.ran_fastenc(lambda: fast(input_ids=ids, pixel_values=x, attention_mask=mask,
                                                return_loss=True))
    assert ran and type(out) is type(ref) and type(fast).__name__ == "CLIPModel"
    for k in FIELDS + ("loss",):
        _close(getattr(out, k), getattr(ref, k))
    assert type(out.text_model_output) is type(ref.text_model_output)
    _close(out.text_model_output.pooler_output, ref.text_model_output.pooler_output)
    assert len(fast(input_ids=ids, pixel_values=x, attention_mask=mask, return_dict=False)) == 6  # (no loss)
    with torch.no_grad():
        rt, ri = hf.get_text_features(ids, attention_mask=mask), hf.get_image_features(pixel_values=x)
        ft, ran_t = _hf.ran_fastenc(lambda: fast.get_text_features(ids, attention_mask=mask))
        fi, ran_i = _hf.ran_fastenc(lambda: fast.get_image_features(pixel_values=x))
    assert ran_t and ran_i and type(ft) is type(rt) and type(fi) is type(ri)
    _close(ft.pooler_output, rt.pooler_output)
    _close(fi.pooler_output, ri.pooler_output)


def test_accelerate_trains_transformers_parameters():
    hf = _hf.clip(seed=18).train()
    ref = _hf.clip(seed=18).train()
    fast = fastenc.accelerate(hf)
    ids, mask = _text([4, 9], seed=19)
    x = _images(2, seed=20)
    out, ran = _hf.ran_fastenc(lambda: fast(input_ids=ids, pixel_values=x, attention_mask=mask, return_loss=True))
    assert ran
    out.loss.backward()
    ref(input_ids=ids, pixel_values=x, attention_mask=mask, return_loss=True).loss.backward()
    mine, theirs = dict(hf.named_parameters()), dict(ref.named_parameters())
    for name in ("logit_scale", "text_projection.weight", "text_model.encoder.layers.0.self_attn.k_proj.weight",
                 "vision_model.embeddings.patch_embedding.weight", "vision_model.pre_layrnorm.bias"):
        _close(mine[name].grad, theirs[name].grad, 1e-5 * max(1.0, float(theirs[name].grad.abs().max())))


def test_encode_texts_and_images():
    hf = _hf.clip(seed=21)
    fe = fastenc.from_hf(hf)
    ids, mask = _text([6, 11, 2], seed=22)
    x = _images(5, seed=23)
    with torch.no_grad():
        rt, ri = hf.get_text_features(ids, attention_mask=mask), hf.get_image_features(x)
    _close(fe.encode(ids, mask), rt.pooler_output)
    seqs = [ids[i, :int(mask[i].sum())].tolist() for i in range(3)]  # token-id lists: batched by length
    _close(fe.encode(seqs, batch_size=2), rt.pooler_output)
    _close(fe.encode(images=x, batch_size=2), ri.pooler_output)
    _close(fe.encode(images=x, normalize=True), torch.nn.functional.normalize(ri.pooler_output, dim=-1))
    mean = fe.encode(ids, mask, pooling="mean")  # (the text tower's states, mean-pooled: hidden 36)
    assert mean.shape == (3, 36)
    with pytest.raises(ValueError, match="exactly one of them"):
        fe.encode()
    with pytest.raises(ValueError, match="exactly one of them"):
        fe.encode(ids, images=x)
    with pytest.raises(ValueError, match="images= takes batch_size and normalize only"):
        fe.encode(images=x, pooling="mean")


def test_text_towers_encode_the_model_text_embedding():
    """encode() of CLIP's text towers gives the model's text embedding: the pooled (EOS) state, through
    text_projection where the model has it, which is what sentence-transformers' CLIP module reads
    (get_text_features' pooler_output)."""
    from sentence_transformers.sentence_transformer.modules.clip_model import CLIPModel as STCLIP

    config, _ = STCLIP._get_default_modality_config({})
    assert config["text"] == {"method": "get_text_features", "method_output_name": "pooler_output"}
    ids, mask = _text([7, 3, 10], seed=24)
    for task, key in (("base", "pooler_output"), ("text_embedding", "text_embeds")):
        hf = _hf.clip_text_model(task, seed=25)
        fe = fastenc.from_hf(hf)
        with torch.no_grad():
            ref = getattr(hf(ids, attention_mask=mask), key)
        _close(fe.encode(ids, mask), ref)
        _close(fe.encode([ids[i, :int(mask[i].sum())].tolist() for i in range(3)], normalize=True),
               torch.nn.functional.normalize(ref, dim=-1))
        assert fe.encode(ids, mask, pooling="mean").shape == (3, 36)  # (mean pooling stays available)
    with pytest.raises(ValueError, match="dimensions must be an int in \\[1, 20\\]"):
        fe.encode(ids, mask, dimensions=21)


def test_bad_input():
    fe = fastenc.from_hf(_hf.clip(seed=26))
    ids, mask = _text([5, 6], seed=27)
    with pytest.raises(ValueError, match="return_loss=True pairs text i with image i.*got 2 and 3"):
        fe(ids, _images(3), mask, return_loss=True)
    with pytest.raises(ValueError, match="interpolate_pos_encoding=True is not supported"):
        fe(ids, _images(2), mask, interpolate_pos_encoding=True)
    with pytest.raises(ValueError, match="pixel_values must be"):
        fe(ids, torch.randn(2, 3, 28, 28), mask)
    with pytest.raises(ValueError, match="input_ids must be in"):
        fe(torch.full((1, 3), 211), _images(1))
    with pytest.raises(ValueError, match="text_config must be a config dict"):
        type(fe.config).from_dict({"text_config": 3})


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_peft_lora_adapter_on_both_towers(tmp_path, merge):
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(_hf.clip(seed=30), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "fc1"]))
    g = torch.Generator().manual_seed(31)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    peft.save_pretrained(tmp_path)
    fe = fastenc.from_hf(_hf.clip(seed=30))
    ids = _text([9, 9], seed=33)[0]
    x = _images(2, seed=32)
    with torch.no_grad():
        plain = fe(ids, x).logits_per_text
        fe.load_lora(tmp_path, merge=merge)
        ref, out = peft(input_ids=ids, pixel_values=x).logits_per_text, fe(ids, x).logits_per_text
    assert float((out - plain).abs().max()) > 1e-2
    _close(out, ref)


@pytest.mark.parametrize("num_labels", [3, 1])
def test_image_classification_with_labels_and_gradients(num_labels):
    # the patch tokens' mean, [CLS] left out, of the last hidden state before post_layernorm, then the classifier;
    # in training every gradient (through the inverse weight map) as transformers'
    hf = _hf.clip("image_classification", seed=40, num_labels=num_labels)
    x = _images(4, seed=41)
    fe, _, _ = _hf.image_classifier_step(hf, "CLIPForImageClassification", x, num_labels, 42, _close)
    assert fe.config.problem_type == hf.config.problem_type
    from fastenc.models import architecture, convert

    grads = {n: p.grad for n, p in fe.named_parameters() if p.grad is not None}
    entries = [e for e in architecture.get("clip").entries(fe.config, "image_classification") if e[0] in grads]
    mine = convert.fastenc_to_hf(entries, grads, fe.config)
    theirs = {n: p.grad for n, p in hf.named_parameters() if p.grad is not None}
    assert "classifier.weight" in theirs and "vision_model.post_layernorm.weight" not in theirs
    assert theirs.keys() == mine.keys(), sorted(theirs.keys() ^ mine.keys())
    for name, t in theirs.items():
        _close(mine[name], t, 1e-5 * max(1.0, float(t.abs().max())))
    with torch.no_grad():
        cls_only = hf.eval().vision_model(x).last_hidden_state[:, 1:].mean(1)  # (what the classifier reads)
        _close(fe.eval()(x), hf.classifier(cls_only))


def test_image_classification_save_and_accelerate(tmp_path):
    hf = _hf.clip("image_classification", seed=43)
    hf.save_pretrained(tmp_path / "hf")
    fe = fastenc.from_pretrained(tmp_path / "hf")
    assert type(fe).__name__ == "CLIPForImageClassification"
    fe.save_pretrained(tmp_path / "fe")
    back = _hf.transformers.CLIPForImageClassification.from_pretrained(tmp_path / "fe", attn_implementation="eager")
    assert set(back.state_dict()) == set(hf.state_dict())
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    config = json.loads((tmp_path / "fe" / "config.json").read_text())
    assert config["architectures"] == ["CLIPForImageClassification"] and len(config["id2label"]) == 3
    again = fastenc.from_pretrained(tmp_path / "fe")
    x = _images(2, seed=44)
    labels = torch.tensor([2, 0])
    with torch.no_grad():
        ref = hf(x, labels=labels)
        _close(again(x), ref.logits)
        out, ran = _hf.ran_fastenc(lambda: fastenc.accelerate(hf)(x, labels=labels))
    assert ran and type(out) is type(ref)
    _close(out.logits, ref.logits)
    _close(out.loss, ref.loss)


def test_image_classification_bad_input():
    from fastenc.models.clip import CLIPConfig, CLIPForImageClassification

    hf = _hf.clip("image_classification", seed=45)
    fe = fastenc.from_hf(hf)
    with pytest.raises(ValueError, match="interpolate_pos_encoding=True is not supported"):
        fe(_images(2), interpolate_pos_encoding=True)
    with pytest.raises(ValueError, match="pixel_values must be"):
        fe(torch.randn(2, 3, 28, 28))
    with pytest.raises(ValueError, match=r"labels must have shape \(2,\)"):
        fe(_images(2), labels=torch.tensor([0, 1, 2]))
    clf = CLIPForImageClassification(CLIPConfig.from_dict(hf.config.to_dict(), num_labels=0))
    assert clf.classifier is None and clf(_images(2)).shape == (2, 48)
    with pytest.raises(ValueError, match="labels need a classifier"):
        clf(_images(2), labels=torch.tensor([0, 1]))
