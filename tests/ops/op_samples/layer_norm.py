"""layer_norm samples: drawn leading dims, hidden sizes, bias, input_bias, residual (returned or not), eps and
layouts."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from fastenc import ops, testing
from fastenc.reference.layer_norm import layer_norm_ref
from op_samples._draw import HIDDEN, Data, is_small, lead_dims, lowp_or_none, randn_grad

OP = "layer_norm"


def case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype("layer_norm")
    lead, hidden = lead_dims(d, is_small(d)), draw(st.sampled_from(HIDDEN), label="hidden")
    x = d.randn(*lead, hidden, dtype=dtype)
    w = d.randn(hidden, dtype=dtype)
    b = d.randn(hidden, dtype=dtype) if draw(st.booleans(), label="bias") else None
    ib = d.randn(hidden, dtype=dtype) if draw(st.booleans(), label="input_bias") else None
    res = d.randn(*lead, hidden, dtype=dtype) if draw(st.booleans(), label="residual") else None
    keep = draw(st.booleans(), label="return_residual")
    eps = draw(st.sampled_from((1e-5, 1e-6, 1e-3)), label="eps")
    xv = d.place(x, "x")
    rv = None if res is None else d.place(res, "residual")
    out = ops.layer_norm(xv, w, b, eps, residual=rv, backend=backend, input_bias=ib, return_residual=keep)
    assert torch.equal(xv, x) and (res is None or torch.equal(rv, res)), "layer_norm wrote into its inputs"
    ref = layer_norm_ref(x, w, b, eps, res, input_bias=ib)
    lowp = lowp_or_none(dtype, lambda: layer_norm_ref(x, w, b, eps, res, upcast=False, input_bias=ib))
    y, y_ref, y_lowp = (out[0] if res is not None and keep else out), (ref[0] if res is not None else ref), \
        (lowp[0] if res is not None and lowp is not None else lowp)
    testing.assert_close(y, y_ref.float(), y_lowp, dtype=dtype, extra=d.extra(dtype, y_ref), name="y")
    if res is not None and keep:
        testing.assert_close(out[1], ref[1].float(), None if lowp is None else lowp[1], dtype=dtype,
                             extra=d.extra(dtype, ref[1]), name="x + residual")


def opcheck_samples() -> dict[str, list[dict]]:
    """fastenc:: custom op -> torch.library.opcheck samples keyed by its schema's argument names (no `backend`):
    inference forwards (stats=False), training forwards with grad-requiring inputs (opcheck's autograd checks run
    their backward) and the backward op."""
    r, g = testing.randn, randn_grad
    h = r(5, 384)
    mean, rstd = h.mean(-1), torch.rsqrt(h.var(-1, unbiased=False) + 1e-5)
    return {
        "layer_norm": [
            dict(x=r(5, 384), weight=r(384), bias=r(384), residual=r(5, 384), input_bias=None, eps=1e-5,
                 store_residual=True, stats=False),
            dict(x=r(3, 1000, dtype=torch.bfloat16), weight=r(1000, dtype=torch.bfloat16), bias=None, residual=None,
                 input_bias=r(1000, dtype=torch.bfloat16), eps=1e-12, store_residual=False, stats=False),
            dict(x=r(7, 768), weight=r(768), bias=r(768), residual=r(7, 768), input_bias=r(768), eps=1e-12,
                 store_residual=False, stats=False),
            dict(x=g(5, 384), weight=g(384), bias=g(384), residual=g(5, 384), input_bias=g(384), eps=1e-5,
                 store_residual=True, stats=True),
            dict(x=g(3, 1001, dtype=torch.bfloat16), weight=g(1001, dtype=torch.bfloat16), bias=None, residual=None,
                 input_bias=None, eps=1e-5, store_residual=False, stats=True),
        ],
        "layer_norm_bwd": [
            dict(dy=r(5, 384), dh=r(5, 384), h=h, weight=r(384), mean=mean, rstd=rstd, need_weight=True,
                 need_bias=True),
            dict(dy=r(5, 384), dh=None, h=h, weight=r(384), mean=mean, rstd=rstd, need_weight=False, need_bias=False),
        ],
    }
