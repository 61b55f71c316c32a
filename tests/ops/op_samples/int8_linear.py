"""int8_linear samples: drawn row counts (leading dims), in/out features (odd, 1 included), bias, residual, GELU form,
symmetric or per-row zero points, layouts of x; the reference quantizes and multiplies in plain PyTorch."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from fastenc import ops, testing
from fastenc.quant import pack_int8
from fastenc.reference.int8_linear import int8_linear_ref
from op_samples._draw import Data, draw_features, lead_dims

OP = "int8_linear"


def case(draw, backend):
    d = Data(draw, backend)
    lead = lead_dims(d, False)
    k, n = draw_features(d, "in_features"), draw_features(d, "out_features")
    x = d.randn(*lead, k, scale=2.0)
    w = d.randn(n, k, scale=0.1)
    bias = d.randn(n) if draw(st.booleans(), label="bias") else None
    residual = d.randn(*lead, n) if draw(st.booleans(), label="residual") else None
    gelu = draw(st.sampled_from((None, "none", "tanh")), label="gelu")
    asym = draw(st.booleans(), label="asym")
    packed = pack_int8(w)
    got = ops.int8_linear(d.place(x, "x"), packed, n, bias, residual=residual, gelu=gelu, asym=asym, backend=backend)
    ref = int8_linear_ref(x.reshape(-1, k), packed, n, bias, None if residual is None else residual.reshape(-1, n),
                          gelu, asym).view(*lead, n)
    testing.assert_close(got, ref, dtype=torch.float32)


def opcheck_samples() -> dict[str, list[dict]]:
    """fastenc:: custom op -> opcheck samples keyed by its schema's argument names (no `backend`)."""
    r = testing.randn
    w1, w2 = r(45, 130, scale=0.1), r(33, 64, scale=0.1)
    return {"int8_linear": [
        dict(x=r(7, 130), packed=pack_int8(w1), n=45, bias=r(45), residual=None, gelu="", asym=True),
        dict(x=r(1, 64), packed=pack_int8(w2), n=33, bias=None, residual=r(1, 33), gelu="tanh", asym=False),
    ]}
