"""rope benchmark spec: ModernBERT-base's rotary embedding of q and k (12 heads x 64) and the long sweep, against
transformers' apply_rotary_pos_emb (rotate_half) in the input dtype; bytes = q, k in and out plus the fp32 cos/sin
rows; fwd + bwd: read q, k, write both; read both gradients, write both."""
from __future__ import annotations

import torch

import fastenc
from fastenc import reference
from fastenc.benchmark.ops._common import (BERT, HEAD_DIM, HEADS, MEMORY, BwdCase, BwdInputs, Case, OpInputs,
                                           backward_heads, backward_rows, cu_seqlens, grad_inputs, rand)
from fastenc.reference.rope import rope_cache

OP, ORDER, BOUND = "rope", 60, MEMORY


def cases() -> list[Case]:
    return [Case(OP, "modernbert-base 8x128 h12 d64", "ModernBERT-base", BERT, {"heads": HEADS, "d": HEAD_DIM},
                 quick=True)]


def sweep(seq: int) -> list[Case]:
    return [Case(OP, f"long 1x{seq} h12 d64", "sweep", [seq], {"heads": HEADS, "d": HEAD_DIM})]


def work(case: Case, e: int) -> tuple[int, int]:
    T, d = case.tokens, case.dims
    hq = d["heads"] * d["d"]
    return 4 * T * hq * e + T * d["d"] * 4, 3 * 2 * T * hq


def setup(case: Case, dev, dtype, g, seed: int) -> OpInputs:
    T, hh, hd = case.tokens, case.dims["heads"], case.dims["d"]
    q = rand(T, hh, hd, device=dev, dtype=dtype, gen=g)
    k = rand(T, hh, hd, device=dev, dtype=dtype, gen=g)
    cos, sin = reference.rope_cache(hd, max(case.lengths), device=dev)
    cu = cu_seqlens(case.lengths, dev)
    pos = torch.cat([torch.arange(L, device=dev, dtype=torch.int32) for L in case.lengths])
    cos_t = torch.cat([cos, cos], -1).to(dtype)[pos.long()][:, None]
    sin_t = torch.cat([sin, sin], -1).to(dtype)[pos.long()][:, None]

    def eager():  # transformers' apply_rotary_pos_emb (rotate_half) in the input dtype
        def rot(t):
            t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
            return torch.cat((-t2, t1), dim=-1)
        return q * cos_t + rot(q) * sin_t, k * cos_t + rot(k) * sin_t
    return OpInputs(lambda be: (lambda: fastenc.ops.rope(q, k, cos, sin, cu_seqlens=cu, backend=be)),
                    {"q": q, "k": k, "cos": cos, "sin": sin, "positions": pos}, {"torch-eager": eager},
                    (reference.rope_ref, q, k, cos, sin, pos))


def backward_case(quick: bool) -> BwdCase:
    rows, (heads, d) = backward_rows(quick), backward_heads(quick)
    return BwdCase(OP, f"{rows} x h{heads} d{d}, 128-token sequences", rows, {"heads": heads, "d": d})


def backward_setup(case: BwdCase, device: str, dtype) -> BwdInputs:
    rnd, twin = grad_inputs(device, dtype)
    e, rows = torch.tensor([], dtype=dtype).element_size(), case.rows
    heads, d = case.dims["heads"], case.dims["d"]
    q, k = rnd(rows, heads, d, grad=True), rnd(rows, heads, d, grad=True)
    cos, sin = (t.to(device) for t in rope_cache(d, 512))
    seq = 128 if rows % 128 == 0 else rows
    cu = torch.arange(0, rows + 1, seq, dtype=torch.int32, device=device)
    pos = torch.arange(rows, device=device) % seq
    c, s = cos[pos][:, None, :].to(dtype), sin[pos][:, None, :].to(dtype)
    twins = twin([q, k])

    def rope(q, k, c, s):
        def rot(t):
            x1, x2 = t[..., :d // 2], t[..., d // 2:]
            return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
        return rot(q), rot(k)
    return BwdInputs(lambda: fastenc.ops.rope(q, k, cos, sin, cu_seqlens=cu), rope, (*twins, c, s), [q, k], twins,
                     [rnd(rows, heads, d), rnd(rows, heads, d)], nbytes=8 * rows * heads * d * e)
