"""fastenc.layers.Linear's inference calls (forward into the buffer cache, planes, accumulate_) reuse the per-part
weight.T and bias views they made at the first call: outputs match the float64 product before and after the weight
or bias is written in place, replaced, swapped under `.data`, or cast; copies start with no views; the grad-mode
path never reads them."""
from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F

from fastenc import testing
from fastenc.layers import Linear, prepack
from _layers import random_linear as _linear


@pytest.fixture(autouse=True)
def plain_gemm(monkeypatch):
    """The plain (unpacked) path at any size: the views are what it multiplies by."""
    monkeypatch.setattr(prepack, "use_packed", lambda x, w: False)


def _ref(x, lin, bias=True):
    b = lin.bias.double() if bias and lin.bias is not None else None
    return F.linear(x.double(), lin.weight.double(), b)


def _all_calls(lin: Linear, x: torch.Tensor) -> None:
    """forward (with and without bias), planes(3), accumulate_: each against the float64 product."""
    acc = testing.randn(x.shape[0], lin.out_features)
    with torch.inference_mode():
        testing.assert_close(lin(x), _ref(x, lin), name="forward")
        testing.assert_close(lin(x, with_bias=False), _ref(x, lin, bias=False), name="forward, no bias")
        parts = lin.planes(x, 3)
        assert len(parts) == 3 and all(p.is_contiguous() for p in parts)
        testing.assert_close(torch.cat(parts, 1), _ref(x, lin), name="planes")
        testing.assert_close(lin.accumulate_(x, acc.clone()), acc.double() + _ref(x, lin, bias=False),
                             name="accumulate_")


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_views_follow_the_parameters(bias):
    lin = _linear(37, 3 * 19, bias=bias)
    x = testing.randn(17, 37)
    _all_calls(lin, x)
    with torch.no_grad():
        lin.weight.mul_(-1.5)                                   # in place (a LoRA merge, an optimizer step)
        if bias:
            lin.bias.add_(2.0)
    _all_calls(lin, x)
    lin.weight = torch.nn.Parameter(testing.randn(3 * 19, 37))  # replaced
    if bias:
        lin.bias = torch.nn.Parameter(testing.randn(3 * 19))
    _all_calls(lin, x)
    lin.weight.data = testing.randn(3 * 19, 37)                 # storage swapped under the same object
    _all_calls(lin, x)
    with torch.no_grad():
        lin.load_state_dict({k: v * 0.5 for k, v in lin.state_dict().items()})
    _all_calls(lin, x)
    lin.double()
    assert "_view_cache" not in lin.__dict__ and "_pack" not in lin.__dict__  # the old storage is let go at once
    _all_calls(lin, x.double())


def test_copies_and_training_see_no_stale_views():
    lin = _linear(24, 30)
    x = testing.randn(9, 24)
    _all_calls(lin, x)
    assert "_view_cache" in lin.__dict__
    buf = io.BytesIO()
    torch.save(lin, buf)
    for other in (copy.deepcopy(lin), torch.load(io.BytesIO(buf.getvalue()), weights_only=False)):
        assert other.__dict__["_view_cache"].wt == ()           # a copy starts empty
        with torch.no_grad():
            other.weight.mul_(3.0)                              # its own weight, not the original's
        _all_calls(other, x)
    _all_calls(lin, x)
    # grad mode: views made under no_grad carry no history; the recorded call must not use them
    xg = x.clone().requires_grad_(True)
    acc = testing.randn(9, 30)
    y = lin.accumulate_(xg, acc.clone())
    dy = testing.randn(9, 30)
    y.backward(dy)
    testing.assert_close(xg.grad, dy.double() @ lin.weight.double(), name="dx")
    testing.assert_close(lin.weight.grad, dy.double().t() @ x.double(), name="dweight")
