"""A BERT block (fastenc.models.bert.BertLayer) under an inference Plan (fastenc.ops.direct) as one straight sequence
of kernel calls: the fused QKV GEMM, attention, Wo accumulated into the residual, LayerNorm, fc1 with its GELU in the
epilogue, fc2 accumulated, LayerNorm. The GEMMs are the int8 GEMM (a quantized Linear) or the fp32 panel GEMM. At a
few tokens the Python between the kernels of the layer-by-layer path is as long as the kernels themselves."""
from __future__ import annotations

import torch

from fastenc import extension
from fastenc.layers import prepack
from fastenc.layers.mlp import _ACTS
from fastenc.ops.direct import Plan
from fastenc.quant.isa import isa

_GELU = {name: approx for name, (approx, _) in _ACTS.items() if approx is not None}  # HF name -> fastenc's


def direct_linears(layer, x: torch.Tensor):
    """(Wqkv, Wo, fc1, fc2) when each runs straight from a Plan's block (direct_block): int8, or fp32 on the
    panel GEMM (prepack.gemm_path at the block's row count; fc2's choice is made on rows of its own width); else
    None."""
    mods, attn = layer._modules, layer._modules["attn"]._modules
    if _GELU[mods["mlp"].act] not in ("none", "tanh"):  # (the GEMM epilogues' GELUs; quick is not one)
        return None
    mlp = mods["mlp"]._modules
    lins = (attn["Wqkv"], attn["Wo"], mlp["fc1"], mlp["fc2"])
    for m in lins:
        if m.int8 is None and (m.weight.dtype != torch.float32 or m.weight.device.type != "cpu"
                               or prepack.gemm_path(x, m.weight) != "panels"):
            return None
    return lins


def direct_block(layer, x: torch.Tensor, plan: Plan, lins) -> torch.Tensor:
    """BertLayer.forward(x, plan=plan) with the four Linears `lins` (direct_linears): the same kernels in the same
    order as SelfAttention.attend() + BertLayer.finish(), each called once, straight. x: (tokens, hidden) fp32, the
    block's own buffer (overwritten, as the layer-by-layer path does)."""
    mods = layer._modules
    attn = mods["attn"]
    wqkv, wo, fc1, fc2 = lins
    ext, t = plan.ext, x.shape[0]
    path = isa() if any(m.int8 is not None for m in lins) else ""

    def gemm(m, a, bias, out, accumulate, gelu=None):
        if m.int8 is not None:
            return m.int8.direct(ext, m.weight, a, bias, out, accumulate, gelu, path)
        return ext.gemm_packed(a, m._packed(m.weight, panels=True)[0], m.out_features, bias, out, accumulate,
                               gelu)

    qkv = gemm(wqkv, x, wqkv.bias, None if wqkv.int8 is not None else
               extension.buffer_empty((t, wqkv.out_features), x), False)
    q, k, v = qkv.view(t, 3, attn.heads, attn.head_dim).unbind(1)
    o = plan.attention(q, k, v, attn.window).view(t, attn.hidden)
    gemm(wo, o, None, x, True)  # x += o @ Wo.T
    x = plan.layer_norm(mods["attn_norm"], x, None, wo.bias)
    h = gemm(fc1, x, fc1.bias, extension.buffer_empty((t, fc1.out_features), x), False, _GELU[mods["mlp"].act])
    gemm(fc2, h, None, x, True)  # x += h @ fc2.T
    return plan.layer_norm(mods["mlp_norm"], x, None, fc2.bias)
