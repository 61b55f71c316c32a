"""The SigLIP text tower against transformers (eager attention, random weights, hidden 36, 3 heads, MLP width 65,
vocabulary 211, 40 positions, head width 20): SiglipTextModel without a mask (max_length padding, as SigLIP is
used) and with left padding, bidirectional attention, gradients in training, accelerate, save_pretrained /
from_pretrained both ways, a mask padding the pooled last column refused."""
from __future__ import annotations

import json

import pytest
import torch

import fastenc
import _models_hf as _hf
from test_clip_text import EOS, _batch, _close, _real


@pytest.mark.parametrize("padding", ["none", "left"])
def test_parity_fp32(padding):
    hf = _hf.siglip_text_model(seed=1)
    fe = fastenc.from_hf(hf)
    assert type(fe).__name__ == "SiglipTextModel"
    ids, mask = _batch([7, 1, 17, 12], seq=19, left=True, seed=2, pad=1)
    if padding == "none":  # every position a real token (pad ids included), no mask
        mask = torch.ones_like(mask)
    with torch.no_grad():
        ref = hf(ids, attention_mask=None if padding == "none" else mask)
        out = fe.hf_forward(ids, None if padding == "none" else mask)
    _close(_real(out["last_hidden_state"], mask), _real(ref.last_hidden_state, mask))
    _close(out["pooler_output"], ref.pooler_output)
    assert out["pooler_output"].shape == (4, 20)


def test_attention_is_bidirectional():
    fe = fastenc.from_hf(_hf.siglip_text_model(seed=3))
    ids, _ = _batch([11], seed=4)
    other = ids.clone()
    other[0, 9] = 5
    with torch.no_grad():
        a, b = fe(ids), fe(other)
    assert float((a[:, 0] - b[:, 0]).abs().max()) > 1e-4


def test_training_gradients_match_transformers():
    hf = _hf.siglip_text_model(seed=5).train()
    fe = fastenc.from_hf(hf).train()
    ids, mask = _batch([9, 4, 15], seed=6, left=True, pad=1)
    ref, out = hf(ids, attention_mask=mask).pooler_output, fe.hf_forward(ids, mask)["pooler_output"]
    target = torch.randn(ref.shape, generator=torch.Generator().manual_seed(7))
    ((ref - target) ** 2).sum().backward()
    ((out - target) ** 2).sum().backward()
    mine = dict(fe.named_parameters())
    pairs = {"embeddings.word.weight": hf.embeddings.token_embedding.weight,
             "embeddings.position.weight": hf.embeddings.position_embedding.weight,
             "layers.0.attn.Wo.weight": hf.encoder.layers[0].self_attn.out_proj.weight,
             "layers.1.mlp.fc1.bias": hf.encoder.layers[1].mlp.fc1.bias,
             "norm.weight": hf.final_layer_norm.weight, "head.weight": hf.head.weight}
    for name, t in pairs.items():
        _close(mine[name].grad, t.grad, 1e-5 * max(1.0, float(t.grad.abs().max())))


def test_accelerate_same_outputs():
    hf = _hf.siglip_text_model(seed=8)
    fast = fastenc.accelerate(hf)
    ids, mask = _batch([6, 14, 3], seed=9, left=True, pad=1)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask)
        out, ran = _hf.ran_fastenc(lambda: fast(ids, attention_mask=mask))
    assert ran and type(out) is type(ref)
    _close(_real(out.last_hidden_state, mask), _real(ref.last_hidden_state, mask))
    _close(out.pooler_output, ref.pooler_output)


def test_from_pretrained_and_save_pretrained(tmp_path):
    hf = _hf.siglip_text_model(seed=10)
    hf.save_pretrained(tmp_path / "hf")
    fe = fastenc.from_pretrained(tmp_path / "hf")
    assert type(fe).__name__ == "SiglipTextModel"
    ids, _ = _batch([12, 12], seed=11)
    with torch.no_grad():
        _close(fe.hf_forward(ids)["pooler_output"], hf(ids).pooler_output)
    fe.save_pretrained(tmp_path / "fe")
    back = _hf.transformers.SiglipTextModel.from_pretrained(tmp_path / "fe", attn_implementation="eager").eval()
    assert set(back.state_dict()) == set(hf.state_dict())
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    config = json.loads((tmp_path / "fe" / "config.json").read_text())
    assert config["model_type"] == "siglip_text_model" and config["projection_size"] == 20
    assert "projection_dim" not in config and config["eos_token_id"] == EOS


def test_padded_last_column_refused():
    fe = fastenc.from_hf(_hf.siglip_text_model())
    ids, mask = _batch([6, 4], seed=12)  # right padding: row 1 ends in padding
    with pytest.raises(ValueError, match=r"attention_mask rows \[1\] have padding in the last column"):
        fe.hf_forward(ids, mask)
