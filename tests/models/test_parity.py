"""Parity with transformers (eager attention, fp32, random weights): every architecture and head, hidden states
and logits within 1e-4 abs on real tokens."""
from __future__ import annotations

import pytest
import torch

import fastenc
import _models_hf as _hf

TOL = 1e-4


def _close(out, ref, mask=None, tol=TOL):
    assert out.shape == ref.shape, (tuple(out.shape), tuple(ref.shape))
    assert torch.isfinite(out).all()
    if mask is not None:
        out, ref = out[mask.bool()], ref[mask.bool()]
    err = float((out - ref).abs().max())
    assert err <= tol, f"max abs error {err:.3e} > {tol:.0e}"


@pytest.mark.parametrize("hidden,heads", [(64, 4), (384, 12)], ids=["h64-d16", "h384-d32"])
@pytest.mark.parametrize("task", ["base", "sequence_classification", "token_classification"])
def test_bert(task, hidden, heads):
    hf = _hf.bert(task, hidden=hidden, heads=heads)
    fe = fastenc.from_hf(hf)
    ids, mask, types = _hf.text_batch([17, 1, 129, 40], seed=hidden)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=types)
    out = fe(ids, mask, types)
    if task == "base":
        _close(out, ref.last_hidden_state, mask)
        _close(fe.pool(out), ref.pooler_output)
    elif task == "token_classification":
        _close(out, ref.logits, mask)
    else:
        _close(out, ref.logits)


@pytest.mark.parametrize("task,pooling", [("base", "cls"), ("sequence_classification", "cls"),
                                          ("sequence_classification", "mean"), ("token_classification", "cls")],
                         ids=["base", "seqcls-cls", "seqcls-mean", "tokcls"])
def test_modernbert(task, pooling):
    # 4 layers: global, local, local, global; sequences longer than the 128-token window.
    hf = _hf.modernbert(task, pooling=pooling)
    fe = fastenc.from_hf(hf)
    ids, mask, _ = _hf.text_batch([300, 17, 129, 200], seed=1)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask)
    out = fe(ids, mask)
    if task == "base":
        _close(out, ref.last_hidden_state, mask)
    elif task == "token_classification":
        _close(out, ref.logits, mask)
    else:
        _close(out, ref.logits)


def test_modernbert_with_biases():
    """attention_bias, mlp_bias and norm_bias on: the Wo biases are fused into the following LayerNorm."""
    hf = _hf.modernbert("base", attention_bias=True, mlp_bias=True, norm_bias=True)
    fe = fastenc.from_hf(hf)
    ids, mask, _ = _hf.text_batch([150, 17, 60], seed=4)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).last_hidden_state
    _close(fe(ids, mask), ref, mask)


def test_modernbert_local_attention_matters():
    # The window must be real: the same weights with every layer global give different states past 128 tokens.
    hf = _hf.modernbert("base", layers=2)
    ids, mask, _ = _hf.text_batch([300], seed=2)
    fe = fastenc.from_hf(hf)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).last_hidden_state
    out = fe(ids, mask)
    _close(out, ref, mask)
    fe_global = fastenc.from_hf(hf)
    for layer in fe_global.layers:
        layer.attn.window = None
    assert float((fe_global(ids, mask) - ref).abs().max()) > 1e-3


def test_modernbert_rope_thetas_from_config():
    hf = _hf.modernbert("base", layers=3)
    fe = fastenc.from_hf(hf)
    assert fe.config.rope_theta_global == 160000.0 and fe.config.rope_theta_local == 10000.0
    assert [layer.kind for layer in fe.layers] == ["full_attention", "sliding_attention", "sliding_attention"]
    assert fe.layers[0].attn_norm is None and fe.layers[1].attn_norm is not None
    assert fe.layers[1].attn.window == (64, 64) and fe.layers[0].attn.window is None


@pytest.mark.parametrize("task", ["base", "image_classification"])
def test_vit_224_16(task):
    hf = _hf.vit(task)
    fe = fastenc.from_hf(hf)
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(x)
    out = fe(x)
    if task == "base":
        assert out.shape == (2, 197, 64)
        _close(out, ref.last_hidden_state)
        _close(fe.pool(out), ref.pooler_output)
    else:
        _close(out, ref.logits)


def test_vit_without_pooler_and_no_qkv_bias():
    cfg = _hf.transformers.ViTConfig(hidden_size=48, num_hidden_layers=1, num_attention_heads=3,
                                     intermediate_size=64, image_size=32, patch_size=8, qkv_bias=False,
                                     attn_implementation="eager")
    hf = _hf._init(_hf.transformers.ViTModel(cfg, add_pooling_layer=False), 4)
    fe = fastenc.from_hf(hf)
    assert fe.pooler is None and fe.layers[0].attn.Wqkv.bias is None
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        ref = hf(x).last_hidden_state
    _close(fe(x), ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_bert_low_precision_to(dtype):
    # .to(dtype) runs end to end in low precision; error within the tolerance rule against transformers' own
    # low-precision error (both measured against transformers in fp32).
    from fastenc import testing

    hf = _hf.bert("base", hidden=64, heads=4)
    ids, mask, _ = _hf.text_batch([17, 5, 40], seed=21)
    with torch.no_grad():
        ref32 = hf(ids, attention_mask=mask).last_hidden_state
    fe = fastenc.from_hf(hf).to(dtype=dtype)
    assert fe.layers[0].attn.Wqkv.weight.dtype == dtype
    out = fe(ids, mask)
    assert out.dtype == dtype
    m = mask.bool()
    hf_lowp = _hf.bert("base", hidden=64, heads=4).to(dtype)
    with torch.no_grad():
        ref_lowp = hf_lowp(ids, attention_mask=mask).last_hidden_state
    testing.assert_close(out[m].float(), ref32[m], ref_lowp[m].float(), dtype=dtype)
