"""attention benchmark spec: varlen bidirectional attention (12 heads x 64) at BERT-base, ViT-B/16, the varlen
workload, ModernBERT's local window (2 x 1024, w 64) and the long sweep, against torch SDPA on the padded batch
(and on a GPU SDPA's flash/efficient/cuDNN backends and flash-attn). FLOPs: 4 d per visible (query, key) pair per
head forward; the backward's S, dP, dV, dK, dQ make fwd + bwd 3.5x the forward."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import fastenc
from fastenc import reference
from fastenc.benchmark.ops._common import (BERT, COMPUTE, HEAD_DIM, HEADS, VIT, BwdCase, BwdInputs, Case, OpInputs,
                                           backward_heads, batch, cu_seqlens, grad_inputs, rand, varlen_lengths)

OP, ORDER, BOUND = "attention", 70, COMPUTE
BASELINES = ("torch-sdpa",)
CUDA_PEERS = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flash-attn")
BACKWARD_BASELINE, BACKWARD_TARGET = "sdpa", ">= 2.0x sdpa"
BACKWARD_ORDER = 0  # first in the backward table


def cases() -> list[Case]:
    dims = {"heads": HEADS, "d": HEAD_DIM, "window": None}
    return [Case(OP, "bert-base 8x128 h12 d64", "BERT-base", BERT, dict(dims), quick=True),
            Case(OP, "varlen 16x[16,384] h12 d64", "varlen workload", varlen_lengths(), dict(dims), quick=True),
            Case(OP, "vit-b16 8x197 h12 d64", "ViT-B/16", VIT, dict(dims)),
            Case(OP, "modernbert-local 2x1024 w64 h12 d64", "ModernBERT-base", batch(2, 1024), dict(dims, window=64))]


def sweep(seq: int) -> list[Case]:
    return [Case(OP, f"long 1x{seq} h12 d64", "sweep", [seq], {"heads": HEADS, "d": HEAD_DIM, "window": None})]


def visible_pairs(lengths: list[int], window: int | None) -> int:
    """Number of (query, key) pairs attention computes: L^2 per sequence, or the band |i - j| <= w."""
    total = 0
    for L in lengths:
        if window is None or window >= L:
            total += L * L
        else:
            w = window
            total += L * (2 * w + 1) - w * (w + 1)  # band minus the two cut-off triangles
    return total


def work(case: Case, e: int) -> tuple[int, int]:
    hd = case.dims["heads"] * case.dims["d"]
    return 4 * case.tokens * hd * e, 4 * visible_pairs(case.lengths, case.dims.get("window")) * hd  # q k v o


def pad_mask(lengths: list[int], device) -> torch.Tensor:
    s = max(lengths)
    return torch.arange(s, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]


def pad(x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """(tokens, ...) -> (batch, max_len, ...) zero-padded."""
    out = x.new_zeros(len(lengths), max(lengths), *x.shape[1:])
    start = 0
    for i, L in enumerate(lengths):
        out[i, :L] = x[start:start + L]
        start += L
    return out


def band_mask(lengths: list[int], window: int | None, device) -> torch.Tensor | None:
    """(batch, 1, S, S) bool mask for SDPA (True = attend), or None when every sequence is full and unbounded."""
    s = max(lengths)
    if window is None and all(L == s for L in lengths):
        return None
    kp = pad_mask(lengths, device)[:, None, None, :]
    if window is None:
        return kp.expand(len(lengths), 1, s, s)
    i = torch.arange(s, device=device)
    band = (i[None, :] - i[:, None]).abs() <= window
    return kp & band[None, None]


def setup(case: Case, dev, dtype, g, seed: int) -> OpInputs:
    T, hh, hd, win = case.tokens, case.dims["heads"], case.dims["d"], case.dims["window"]
    q, k, v = (rand(T, hh, hd, device=dev, dtype=dtype, gen=g) for _ in range(3))
    cu, longest = cu_seqlens(case.lengths, dev), max(case.lengths)
    window = None if win is None else (win, win)
    sel = {"q": q, "k": k, "v": v, "cu_seqlens": cu, "max_seqlen": longest,
           "window": (-1, -1) if win is None else (win, win), "scale": hd ** -0.5}
    qp, kp, vp = (pad(t, case.lengths).transpose(1, 2).contiguous() for t in (q, k, v))  # (b, h, s, d)
    mask = band_mask(case.lengths, win, dev)
    inp = OpInputs(lambda be: (lambda: fastenc.ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=longest,
                                                             window=window, backend=be)),
                   sel, {"torch-sdpa": lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)}, None)
    if dev.type == "cuda":
        _sdpa_backends(inp, qp, kp, vp, mask)
        _flash_attn(inp, q, k, v, cu, longest, win)
    kpm = pad_mask(case.lengths, dev)
    q4, k4, v4 = (pad(t, case.lengths) for t in (q, k, v))
    inp.reference = (reference.attention_ref, q4, k4, v4, kpm, (-1, -1) if win is None else (win, win))
    inp.canon["torch-compile"] = lambda o: o[kpm]  # (b, s, h, d) padded -> packed
    for n in ("torch-sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn"):
        inp.canon[n] = lambda o: o.transpose(1, 2)[kpm]
    return inp


def _sdpa_backends(inp: OpInputs, qp, kp, vp, mask) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, be in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION),
                     ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
        def fn(be=be):
            with sdpa_kernel(be):
                return F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)
        try:
            fn()
            inp.others[name] = fn
        except Exception as e:  # backend refuses these inputs (mask, dtype, head dim)
            inp.skipped[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def _flash_attn(inp: OpInputs, q, k, v, cu, longest, win) -> None:
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        inp.skipped["flash-attn"] = "flash-attn not installed"
        return
    if q.dtype not in (torch.float16, torch.bfloat16):
        inp.skipped["flash-attn"] = "flash-attn needs fp16/bf16"
        return
    ws = (-1, -1) if win is None else (win, win)
    inp.others["flash-attn"] = lambda: flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=False,
                                                              window_size=ws)


def backward_case(quick: bool) -> BwdCase:
    """The varlen workload (16 sequences with lengths in [16, 384], seed 0); quick: three short sequences."""
    lens = [5, 17, 9] if quick else varlen_lengths()
    heads, d = backward_heads(quick)
    return BwdCase(OP, f"varlen {len(lens)}x[{min(lens)},{max(lens)}] h{heads} d{d}", sum(lens),
                   {"heads": heads, "d": d}, lens)


def backward_setup(case: BwdCase, device: str, dtype) -> BwdInputs:
    rnd, _ = grad_inputs(device, dtype)
    heads, d, lens = case.dims["heads"], case.dims["d"], case.lengths
    total, longest, nb = sum(lens), max(lens), len(lens)
    q, k, v = (rnd(total, heads, d, grad=True) for _ in range(3))
    g = rnd(total, heads, d)
    cu = torch.zeros(nb + 1, dtype=torch.int32, device=device)
    cu[1:] = torch.tensor(lens, device=device).cumsum(0)
    mask = torch.arange(longest, device=device)[None, :] < torch.tensor(lens, device=device)[:, None]

    def pad_heads(t):
        out = t.new_zeros(nb, longest, heads, d)
        out[mask] = t
        return out.transpose(1, 2).contiguous()  # (b, h, s, d)
    padded = [pad_heads(t.detach()).requires_grad_(True) for t in (q, k, v)]
    attn_mask = mask[:, None, None, :]

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    fwd = sum(4.0 * s * s * d for s in lens) * heads
    return BwdInputs(lambda: fastenc.ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=longest), sdpa,
                     tuple(padded), [q, k, v], padded, [pad_heads(g)], flops=3.5 * fwd,
                     unpad=lambda t: t.transpose(1, 2)[mask])


def backward_select(bench: BwdInputs) -> dict:
    """The inputs automatic backend selection is asked with (as the op asks)."""
    return {"q": bench.leaves[0]}
