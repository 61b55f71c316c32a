"""rms_norm samples: drawn leading dims, hidden sizes, residual, eps and layouts."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from fastenc import ops, testing
from fastenc.reference.rms_norm import rms_norm_ref
from op_samples._draw import HIDDEN, Data, is_small, lead_dims, lowp_or_none, randn_grad

OP = "rms_norm"


def case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype("rms_norm")
    lead, hidden = lead_dims(d, is_small(d)), draw(st.sampled_from(HIDDEN), label="hidden")
    x, w = d.randn(*lead, hidden, dtype=dtype), d.randn(hidden, dtype=dtype)
    res = d.randn(*lead, hidden, dtype=dtype) if draw(st.booleans(), label="residual") else None
    eps = draw(st.sampled_from((1e-6, 1e-5)), label="eps")
    xv = d.place(x, "x")
    rv = None if res is None else d.place(res, "residual")
    out = ops.rms_norm(xv, w, eps, residual=rv, backend=backend)
    assert torch.equal(xv, x) and (res is None or torch.equal(rv, res)), "rms_norm wrote into its inputs"
    ref = rms_norm_ref(x, w, eps, res)
    lowp = lowp_or_none(dtype, lambda: rms_norm_ref(x, w, eps, res, upcast=False))
    pairs = [(out, ref, lowp, "y")] if res is None else \
        [(out[i], ref[i], None if lowp is None else lowp[i], n) for i, n in enumerate(("y", "x + residual"))]
    for o, r, lp, name in pairs:
        testing.assert_close(o, r.float(), lp, dtype=dtype, extra=d.extra(dtype, r), name=name)


def opcheck_samples() -> dict[str, list[dict]]:
    """fastenc:: custom op -> opcheck samples (see layer_norm's): inference, training and the backward op."""
    r, g = testing.randn, randn_grad
    h = r(5, 384)
    rstd = torch.rsqrt(h.var(-1, unbiased=False) + 1e-5)
    return {
        "rms_norm": [
            dict(x=r(5, 384), weight=r(384), residual=r(5, 384), eps=1e-6, stats=False),
            dict(x=r(3, 1000, dtype=torch.float16), weight=r(1000, dtype=torch.float16), residual=None, eps=1e-6,
                 stats=False),
            dict(x=g(5, 384), weight=g(384), residual=g(5, 384), eps=1e-6, stats=True),
            dict(x=g(3, 1001), weight=None, residual=None, eps=1e-6, stats=True),
        ],
        "rms_norm_bwd": [
            dict(dy=r(5, 384), dh=r(5, 384), h=h, weight=r(384), rstd=rstd, need_weight=True),
            dict(dy=r(5, 384), dh=None, h=h, weight=None, rstd=rstd, need_weight=False),
        ],
    }
