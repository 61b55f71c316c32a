"""Bad input to the norm, activation (gelu, geglu, swiglu) and rope ops, and bad backend choices: each raises ValueError or TypeError
whose message names the argument, what was expected and what was received."""
import pytest
import torch

import fastenc
from fastenc import testing

ops = fastenc.ops
r = testing.randn


def _cos_sin(d=64, p=32):
    return ops.rope_cache(d, p)


# (id, callable, exception type, [fragments the message must contain])
CASES = [
    # norms: weight / bias / residual shapes
    ("ln-weight-length", lambda: ops.layer_norm(r(4, 384), r(383)), ValueError, ["weight", "(384,)", "(383,)"]),
    ("ln-bias-length", lambda: ops.layer_norm(r(4, 384), r(384), r(768)), ValueError, ["bias", "(384,)", "(768,)"]),
    ("ln-residual-shape", lambda: ops.layer_norm(r(4, 384), r(384), residual=r(3, 384)), ValueError,
     ["residual", "(4, 384)", "(3, 384)"]),
    ("rms-weight-length", lambda: ops.rms_norm(r(2, 3, 1000), r(1001)), ValueError, ["weight", "(1000,)", "(1001,)"]),
    # mismatched dtypes
    ("ln-weight-dtype", lambda: ops.layer_norm(r(4, 384), r(384, dtype=torch.float16)), TypeError,
     ["weight", "float32", "float16"]),
    ("ln-bias-dtype", lambda: ops.layer_norm(r(4, 384, dtype=torch.bfloat16), r(384, dtype=torch.bfloat16),
                                             r(384)), TypeError, ["bias", "bfloat16", "float32"]),
    ("rms-residual-dtype", lambda: ops.rms_norm(r(4, 384), r(384), residual=r(4, 384, dtype=torch.float16)),
     TypeError, ["residual", "float32", "float16"]),
    ("gelu-bias-dtype", lambda: ops.gelu(r(4, 384), r(384, dtype=torch.bfloat16)), TypeError,
     ["bias", "float32", "bfloat16"]),
    ("rope-k-dtype", lambda: ops.rope(r(5, 2, 64), r(5, 2, 64, dtype=torch.float16), *_cos_sin()), TypeError,
     ["k", "float32", "float16"]),
    # mismatched devices (the meta device stands in for a second device on a CPU-only machine)
    ("ln-weight-device", lambda: ops.layer_norm(r(4, 384), torch.empty(384, device="meta")), ValueError,
     ["weight", "cpu", "meta"]),
    ("gelu-bias-device", lambda: ops.gelu(r(4, 384), torch.empty(384, device="meta")), ValueError,
     ["bias", "cpu", "meta"]),
    ("rope-cos-device", lambda: ops.rope(r(5, 2, 64), r(5, 2, 64), torch.empty(32, 32, device="meta"),
                                         torch.empty(32, 32, device="meta")), ValueError, ["cos", "cpu", "meta"]),
    ("rope-k-device", lambda: ops.rope(r(5, 2, 64), torch.empty(5, 2, 64, device="meta"), *_cos_sin()),
     (TypeError, ValueError), ["k", "cpu", "meta"]),
    # integer inputs
    ("ln-int-x", lambda: ops.layer_norm(torch.ones(4, 384, dtype=torch.int32), r(384)), TypeError,
     ["x", "float32, float16 or bfloat16", "int32"]),
    ("ln-int-weight", lambda: ops.layer_norm(r(4, 384), torch.ones(384, dtype=torch.int64)), TypeError,
     ["weight", "int64"]),
    ("rms-int-x", lambda: ops.rms_norm(torch.ones(4, 8, dtype=torch.int64), r(8)), TypeError, ["x", "int64"]),
    ("gelu-int-x", lambda: ops.gelu(torch.ones(4, 8, dtype=torch.int32)), TypeError, ["x", "int32"]),
    ("geglu-int-x", lambda: ops.geglu(torch.ones(4, 8, dtype=torch.uint8)), TypeError, ["x", "uint8"]),
    ("rope-int-q", lambda: ops.rope(torch.ones(5, 2, 64, dtype=torch.int32), r(5, 2, 64), *_cos_sin()), TypeError,
     ["q", "int32"]),
    ("rope-bool-positions", lambda: ops.rope(r(5, 2, 64), r(5, 2, 64), *_cos_sin(),
                                             position_ids=torch.ones(5, dtype=torch.bool)), TypeError,
     ["position_ids", "int32/int64", "bool"]),
    ("ln-not-tensor", lambda: ops.layer_norm([[1.0, 2.0]], r(2)), TypeError, ["x", "torch.Tensor", "list"]),
    # eps
    ("ln-eps-zero", lambda: ops.layer_norm(r(4, 384), r(384), eps=0.0), ValueError, ["eps", "> 0", "0.0"]),
    ("ln-eps-negative", lambda: ops.layer_norm(r(4, 384), r(384), eps=-1e-5), ValueError, ["eps", "> 0", "-1e-05"]),
    ("rms-eps-zero", lambda: ops.rms_norm(r(4, 384), r(384), eps=0), ValueError, ["eps", "> 0", "0"]),
    ("rms-eps-string", lambda: ops.rms_norm(r(4, 384), r(384), eps="1e-6"), TypeError, ["eps", "float", "str"]),
    # activations
    ("gelu-approximate", lambda: ops.gelu(r(4, 8), approximate="fast"), ValueError,
     ["approximate", "'none', 'tanh' or 'quick'", "'fast'"]),
    ("geglu-approximate", lambda: ops.geglu(r(4, 8), approximate="quick_gelu"), ValueError,
     ["geglu", "approximate", "'quick'", "'quick_gelu'"]),
    ("swiglu-odd-width", lambda: ops.swiglu(r(4, 1001)), ValueError, ["swiglu", "x", "even last dim", "1001"]),
    ("swiglu-0d", lambda: ops.swiglu(torch.tensor(1.0)), ValueError, ["swiglu", "x", "even last dim", "0-d"]),
    ("swiglu-int-x", lambda: ops.swiglu(torch.ones(4, 8, dtype=torch.int32)), TypeError, ["swiglu", "x", "int32"]),
    ("swiglu-up-shape", lambda: ops.swiglu(r(4, 8), r(4, 9)), ValueError, ["swiglu", "up", "(4, 8)", "(4, 9)"]),
    ("swiglu-up-dtype", lambda: ops.swiglu(r(4, 8), up=r(4, 8, dtype=torch.bfloat16)), TypeError,
     ["swiglu", "up", "gate's dtype float32", "bfloat16"]),
    ("swiglu-up-device", lambda: ops.swiglu(r(4, 8), torch.empty(4, 8, device="meta")), ValueError,
     ["swiglu", "up", "gate's device cpu", "meta"]),
    ("swiglu-up-not-tensor", lambda: ops.swiglu(r(4, 8), up=[1.0] * 8), TypeError, ["swiglu", "up", "list"]),
    ("geglu-odd-width", lambda: ops.geglu(r(4, 7)), ValueError, ["last dim", "even", "(4, 7)"]),
    ("gelu-bias-length", lambda: ops.gelu(r(4, 8), r(9)), ValueError, ["bias", "(8,)", "(9,)"]),
    ("ln-input-bias-length", lambda: ops.layer_norm(r(4, 384), r(384), input_bias=r(383)), ValueError,
     ["input_bias", "(384,)", "(383,)"]),
    ("ln-return-residual-type", lambda: ops.layer_norm(r(4, 8), r(8), residual=r(4, 8), return_residual="no"),
     TypeError, ["return_residual", "bool", "str"]),
    # out= of the activations
    ("gelu-out-shape", lambda: ops.gelu(r(4, 8), out=r(4, 9)), ValueError, ["out", "(4, 8)", "(4, 9)"]),
    ("gelu-out-dtype", lambda: ops.gelu(r(4, 8), out=r(4, 8, dtype=torch.float16)), TypeError,
     ["out", "float32", "float16"]),
    ("gelu-out-overlap", lambda: (lambda x: ops.gelu(x[:, :8], out=x[:, 1:9]))(r(4, 16)), ValueError,
     ["out", "overlaps x"]),
    ("gelu-out-strided", lambda: ops.gelu(r(4, 8), out=r(8, 4).t()), ValueError, ["out", "stride"]),
    ("geglu-out-shape", lambda: ops.geglu(r(4, 8), out=r(4, 8)), ValueError, ["out", "(4, 4)", "(4, 8)"]),
    ("geglu-out-gate-half", lambda: (lambda x: ops.geglu(x, out=x[:, 4:]))(r(4, 8)), ValueError,
     ["out", "overlaps x"]),
    # rope: cos/sin that do not fit, positions
    ("rope-cos-too-wide", lambda: ops.rope(r(5, 2, 64), r(5, 2, 64), *_cos_sin(d=80)), ValueError,
     ["cos/sin", "1..head_dim/2=32", "40"]),
    ("rope-cos-sin-mismatch", lambda: ops.rope(r(5, 2, 64), r(5, 2, 64), r(32, 32), r(32, 16)), ValueError,
     ["cos and sin", "(32, 32)", "(32, 16)"]),
    ("rope-cos-1d", lambda: ops.rope(r(5, 2, 64), r(5, 2, 64), r(32), r(32)), ValueError,
     ["cos and sin", "(max_positions, rotary_dim/2)", "(32,)"]),
    ("rope-too-short-table", lambda: ops.rope(r(40, 2, 64), r(40, 2, 64), *_cos_sin(p=32)), ValueError,
     ["sequence length 40", "32 positions"]),
    ("rope-position-out-of-range", lambda: ops.rope(r(5, 2, 64), r(5, 2, 64), *_cos_sin(p=32),
                                                    position_ids=torch.tensor([0, 1, 2, 3, 32])), ValueError,
     ["position_ids", "[0, 32)", "32"]),
    ("rope-q-2d", lambda: ops.rope(r(5, 64), r(5, 64), *_cos_sin()), ValueError, ["q", "(tokens, heads, dim)", "(5, 64)"]),
    ("rope-k-layout", lambda: ops.rope(r(5, 2, 64), r(6, 2, 64), *_cos_sin()), ValueError, ["k", "(5,)", "(6, 2, 64)"]),
    ("rope-cu-seqlens-int64", lambda: ops.rope(r(5, 2, 64), r(5, 2, 64), *_cos_sin(),
                                               cu_seqlens=torch.tensor([0, 5])), ValueError,
     ["cu_seqlens", "int32", "int64"]),
    ("rope-cu-seqlens-total", lambda: ops.rope(r(5, 2, 64), r(5, 2, 64), *_cos_sin(),
                                               cu_seqlens=torch.tensor([0, 4], dtype=torch.int32)), ValueError,
     ["cu_seqlens", "total_tokens=5", "4"]),
    # backends
    ("unknown-backend", lambda: ops.layer_norm(r(4, 8), r(8), backend="tpu"), ValueError,
     ["backend", "'tpu'", "reference", "triton", "cuda", "cpu"]),
    ("unknown-backend-rope", lambda: ops.rope(r(5, 2, 64), r(5, 2, 64), *_cos_sin(), backend="fast"), ValueError,
     ["backend", "'fast'"]),
    ("cuda-backend-cpu-tensor", lambda: ops.gelu(r(4, 8), backend="cuda"), ValueError,
     ["gelu", "cuda", "device cpu not in ['cuda']"]),
    ("cuda-backend-cpu-tensor-norm", lambda: ops.rms_norm(r(4, 8), r(8), backend="cuda"), ValueError,
     ["rms_norm", "cuda", "device cpu"]),
]


@pytest.mark.parametrize("fn,exc,fragments", [pytest.param(f, e, m, id=i) for i, f, e, m in CASES])
def test_bad_input(fn, exc, fragments):
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    missing = [f for f in fragments if f not in msg]
    assert not missing, f"message {msg!r} lacks {missing}"


def test_unknown_backend_in_env_and_context(monkeypatch):
    monkeypatch.setenv("FASTENC_BACKEND", "gpu")
    with pytest.raises(ValueError, match="FASTENC_BACKEND.*'gpu'"):
        ops.gelu(r(2, 8))
    monkeypatch.delenv("FASTENC_BACKEND")
    with pytest.raises(ValueError, match="use_backend.*'nope'"):
        with fastenc.use_backend("nope"):
            pass


def test_explicit_backend_lists_every_reason():
    """A list of explicit backends that cannot serve reports each one's reason."""
    with pytest.raises(ValueError) as info:
        ops.layer_norm(r(4, 8), r(8), backend="cuda,cuda")
    assert str(info.value).count("cuda:") == 2
