"""lora_linear samples: drawn sizes, ranks, leading dims, bias, scale and layouts."""
from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from fastenc import ops, testing
from fastenc.reference.lora_linear import lora_linear_ref
from op_samples._draw import Data, draw_features, draw_rank, lead_dims, lowp_or_none, randn_grad

INTERPRETER_DTYPES = (torch.float32, torch.float16)  # its Triton kernel uses tl.dot

OP = "lora_linear"


def case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype(OP, INTERPRETER_DTYPES)
    out_f, in_f, r = draw_features(d, "out_features"), draw_features(d, "in_features"), draw_rank(d)
    lead = lead_dims(d, True)
    x = d.randn(*lead, in_f, dtype=dtype)
    w = d.randn(out_f, in_f, dtype=dtype, scale=1 / math.sqrt(in_f))
    bias = d.randn(out_f, dtype=dtype) if draw(st.booleans(), label="bias") else None
    a, b = d.randn(r, in_f, dtype=dtype, scale=1 / math.sqrt(in_f)), d.randn(out_f, r, dtype=dtype)
    scale = draw(st.floats(-2.0, 2.0, allow_nan=False), label="scale")
    xv, wv, av, bv = d.place(x, "x"), d.place(w, "weight"), d.place(a, "lora_a"), d.place(b, "lora_b")
    got = ops.lora_linear(xv, wv, bias, av, bv, scale, backend=backend)
    assert got.shape == (*lead, out_f) and got.dtype == dtype
    ref = lora_linear_ref(x, w, bias, a, b, scale)
    lowp = lowp_or_none(dtype, lambda: lora_linear_ref(x, w, bias, a, b, scale, upcast=False))
    testing.assert_close(got, ref.float(), lowp, dtype=dtype, extra=d.extra(dtype, ref))


def opcheck_samples() -> dict[str, list[dict]]:
    """fastenc:: custom op -> opcheck samples: inference forwards, training forwards with grad-requiring inputs and
    the backward op."""
    r, g = testing.randn, randn_grad
    return {
        "lora_linear": [
            dict(x=r(5, 40), weight=r(48, 40), bias=r(48), lora_a=r(8, 40), lora_b=r(48, 8), scale=0.5),
            dict(x=r(3, 40), weight=r(48, 40), bias=None, lora_a=r(4, 40), lora_b=r(48, 4), scale=1.0),
            dict(x=g(5, 40), weight=r(48, 40), bias=r(48), lora_a=g(8, 40), lora_b=g(48, 8), scale=0.5),
            dict(x=g(3, 40), weight=g(48, 40), bias=g(48), lora_a=g(4, 40), lora_b=g(48, 4), scale=1.0),
        ],
        "lora_linear_bwd": [
            dict(dy=r(5, 48), x=r(5, 40), weight=r(48, 40), lora_a=r(8, 40), lora_b=r(48, 8), scale=0.5, need_x=True,
                 need_weight=False, need_bias=False, need_a=True, need_b=True),
            dict(dy=r(3, 48), x=r(3, 40), weight=r(48, 40), lora_a=r(4, 40), lora_b=r(48, 4), scale=2.0,
                 need_x=True, need_weight=True, need_bias=True, need_a=True, need_b=True),
        ],
    }
