"""Property tests: every op against its fp32 reference under the tolerance rule (testing.assert_close), over
random shapes (odd sizes, 1 included), dtypes, memory layouts (storage offsets, non-contiguous views whose
surroundings hold NaN), varlen splits (empty sequences included) and a cu_seqlens changed in place between calls.

Hypothesis draws the cases; runs are derandomized (the same examples in every run, no example database) and
bounded (a few examples per backend, fewer for Triton under the interpreter). A falsifying example prints its
draws, and the tensors come from the drawn `seed`, so it replays exactly. Triton's dot-based kernels (attention,
merge_lora, lora_linear) run fp32/fp16 only under the interpreter (its bf16 tl.dot is wrong).
"""
from __future__ import annotations

import itertools
import math
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fastenc import ops, registry, testing
from fastenc.reference import rope_cache, rope_ref
from fastenc.reference.attention import attention_ref, attention_varlen_ref
from fastenc.reference.geglu import geglu_ref
from fastenc.reference.gelu import gelu_ref
from fastenc.reference.layer_norm import layer_norm_ref
from fastenc.reference.lora_linear import lora_linear_ref
from fastenc.reference.merge_lora import merge_lora_ref
from fastenc.reference.rms_norm import rms_norm_ref

INTERP = registry.interpreter_on() and not torch.cuda.is_available()
EXAMPLES = {"reference": 12, "cpu": 12, "triton": 5 if INTERP else 12, "cuda": 12}
DOT_OPS = ("attention", "merge_lora", "lora_linear")
HIDDEN = (1, 2, 7, 64, 383, 384, 1000, 1001, 1152)
LAYOUTS = ("contiguous", "offset", "strided", "transposed")


def _backends(op: str) -> list[str]:
    return testing.backends_for(op)


def run(backend: str, case, examples: int | None = None) -> None:
    """Run `case(draw, backend)` over derandomized Hypothesis examples (no shrinking: bounded time; the falsifying
    example's draws are printed as found)."""

    @settings(max_examples=examples or EXAMPLES[backend], deadline=None, derandomize=True, database=None,
              phases=(Phase.explicit, Phase.generate), print_blob=False,
              suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much))
    @given(st.data())
    def prop(data):
        case(data.draw, backend)

    prop()


class Data:
    """Tensors of one example, all drawn from one seed (so the example replays from its printed draws)."""

    def __init__(self, draw, backend: str):
        self.draw, self.backend = draw, backend
        self.device = testing.device_for(backend)
        self.gen = testing.generator(draw(st.integers(0, 2**31 - 1), label="seed"))

    def randn(self, *shape, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=self.gen) * scale).to(device=self.device, dtype=dtype)

    def dtype(self, op: str) -> torch.dtype:
        dts = testing.DTYPES
        if self.backend == "triton" and INTERP and op in DOT_OPS:
            dts = (torch.float32, torch.float16)
        if self.backend == "cuda" and op == "attention":
            dts = (torch.float16, torch.bfloat16)
        return self.draw(st.sampled_from(dts), label="dtype")

    def place(self, t: torch.Tensor, label: str, layouts=LAYOUTS) -> torch.Tensor:
        """t's values in a drawn memory layout; memory around a view holds NaN, so a read outside it shows."""
        kind = self.draw(st.sampled_from(layouts), label=f"{label} layout")
        nan = float("nan")
        if kind == "offset":
            buf = torch.full((t.numel() + 3,), nan, dtype=t.dtype, device=t.device)
            view = buf[3:].view(t.shape)
        elif kind == "strided" and t.dim():
            buf = torch.full((*t.shape[:-1], t.shape[-1] + 5), nan, dtype=t.dtype, device=t.device)
            view = buf[..., 2:2 + t.shape[-1]]
        elif kind == "transposed" and t.dim() >= 2:
            view = torch.full(t.shape[:-2] + t.shape[-2:][::-1], nan, dtype=t.dtype, device=t.device).transpose(-1, -2)
        else:
            return t.clone()
        view.copy_(t)
        return view

    def extra(self, dtype, ref32) -> float:
        return testing.interpreter_extra(self.backend, dtype, ref32)


def _lowp(dtype, fn):
    return None if dtype == torch.float32 else fn()


def _lead(d: Data, small: bool) -> tuple[int, ...]:
    rows = st.sampled_from((1, 2, 5, 17)) if small else st.sampled_from((1, 2, 5, 17, 129))
    return d.draw(st.one_of(st.tuples(rows), st.tuples(st.integers(1, 3), rows)), label="leading dims")


def _small(d: Data) -> bool:
    return d.backend == "triton" and INTERP


# ---------------------------------------------------------------- norms
def _layer_norm_case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype("layer_norm")
    lead, hidden = _lead(d, _small(d)), draw(st.sampled_from(HIDDEN), label="hidden")
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
    lowp = _lowp(dtype, lambda: layer_norm_ref(x, w, b, eps, res, upcast=False, input_bias=ib))
    y, y_ref, y_lowp = (out[0] if res is not None and keep else out), (ref[0] if res is not None else ref), \
        (lowp[0] if res is not None and lowp is not None else lowp)
    testing.assert_close(y, y_ref.float(), y_lowp, dtype=dtype, extra=d.extra(dtype, y_ref), name="y")
    if res is not None and keep:
        testing.assert_close(out[1], ref[1].float(), None if lowp is None else lowp[1], dtype=dtype,
                             extra=d.extra(dtype, ref[1]), name="x + residual")


def _rms_norm_case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype("rms_norm")
    lead, hidden = _lead(d, _small(d)), draw(st.sampled_from(HIDDEN), label="hidden")
    x, w = d.randn(*lead, hidden, dtype=dtype), d.randn(hidden, dtype=dtype)
    res = d.randn(*lead, hidden, dtype=dtype) if draw(st.booleans(), label="residual") else None
    eps = draw(st.sampled_from((1e-6, 1e-5)), label="eps")
    xv = d.place(x, "x")
    rv = None if res is None else d.place(res, "residual")
    out = ops.rms_norm(xv, w, eps, residual=rv, backend=backend)
    assert torch.equal(xv, x) and (res is None or torch.equal(rv, res)), "rms_norm wrote into its inputs"
    ref = rms_norm_ref(x, w, eps, res)
    lowp = _lowp(dtype, lambda: rms_norm_ref(x, w, eps, res, upcast=False))
    pairs = [(out, ref, lowp, "y")] if res is None else \
        [(out[i], ref[i], None if lowp is None else lowp[i], n) for i, n in enumerate(("y", "x + residual"))]
    for o, r, lp, name in pairs:
        testing.assert_close(o, r.float(), lp, dtype=dtype, extra=d.extra(dtype, r), name=name)


@pytest.mark.parametrize("backend", _backends("layer_norm"))
def test_layer_norm(backend):
    run(backend, _layer_norm_case)


@pytest.mark.parametrize("backend", _backends("rms_norm"))
def test_rms_norm(backend):
    run(backend, _rms_norm_case)


# ---------------------------------------------------------------- activations
def _out_mode(d: Data, xv: torch.Tensor, shape, dtype, inplace_target):
    """None (a new tensor), a NaN-poisoned separate `out`, or in place over `inplace_target` (when allowed)."""
    modes = ("new", "out") + (("inplace",) if inplace_target is not None else ())
    mode = d.draw(st.sampled_from(modes), label="out")
    if mode == "new":
        return None
    if mode == "out":
        return testing.poison(torch.empty(shape, dtype=dtype, device=d.device))
    return inplace_target


def _gelu_case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype("gelu")
    lead, n = _lead(d, _small(d)), draw(st.sampled_from(HIDDEN), label="N")
    approximate = draw(st.sampled_from(("none", "tanh")), label="approximate")
    x = d.randn(*lead, n, dtype=dtype, scale=3.0)
    bias = d.randn(n, dtype=dtype) if draw(st.booleans(), label="bias") else None
    xv = d.place(x, "x")
    out = _out_mode(d, xv, x.shape, dtype, xv if xv.is_contiguous() else None)
    got = ops.gelu(xv, bias, approximate, backend=backend, out=out)
    if out is not None:
        assert got is out, "gelu(out=...) must return out"
    ref = gelu_ref(x, bias, approximate)
    lowp = _lowp(dtype, lambda: gelu_ref(x, bias, approximate, upcast=False))
    testing.assert_close(got, ref.float(), lowp, dtype=dtype, extra=d.extra(dtype, ref))


def _geglu_case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype("geglu")
    lead, n = _lead(d, _small(d)), draw(st.sampled_from(HIDDEN), label="N")
    approximate = draw(st.sampled_from(("none", "tanh")), label="approximate")
    x = d.randn(*lead, 2 * n, dtype=dtype, scale=2.0)
    xv = d.place(x, "x")
    out = _out_mode(d, xv, (*lead, n), dtype, xv[..., :n] if xv.is_contiguous() else None)
    got = ops.geglu(xv, approximate, backend=backend, out=out)
    if out is not None:
        assert got is out, "geglu(out=...) must return out"
    ref = geglu_ref(x, approximate)
    lowp = _lowp(dtype, lambda: geglu_ref(x, approximate, upcast=False))
    testing.assert_close(got, ref.float(), lowp, dtype=dtype, extra=d.extra(dtype, ref))


@pytest.mark.parametrize("backend", _backends("gelu"))
def test_gelu(backend):
    run(backend, _gelu_case)


@pytest.mark.parametrize("backend", _backends("geglu"))
def test_geglu(backend):
    run(backend, _geglu_case)


# ---------------------------------------------------------------- varlen splits
def _split(draw, total: int, label: str, n: int | None = None) -> list[int]:
    """cu_seqlens of a random split of `total` tokens into n (drawn: 1..5) sequences, empty sequences allowed."""
    n = draw(st.integers(1, 5), label=f"{label} sequences") if n is None else n
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=n - 1, max_size=n - 1), label=f"{label} cuts"))
    return [0, *cuts, total]


def _cu(cu: list[int], device) -> torch.Tensor:
    return torch.tensor(cu, dtype=torch.int32, device=device)


def _positions(cu: list[int], device) -> torch.Tensor:
    """Each packed token's position inside its own sequence, from the split itself (not from fastenc)."""
    pos = list(itertools.chain.from_iterable(range(e - a) for a, e in zip(cu, cu[1:])))
    return torch.tensor(pos, dtype=torch.int64, device=device)


# ---------------------------------------------------------------- rope
def _rope_inputs(d: Data, dtype, tokens_lead):
    hq, hk = d.draw(st.integers(1, 3), label="heads_q"), d.draw(st.integers(1, 3), label="heads_k")
    dim = d.draw(st.sampled_from((2, 4, 8, 16, 32, 64, 80)), label="head_dim")
    half = d.draw(st.integers(1, dim // 2), label="rotary_dim/2")
    q = d.randn(*tokens_lead, hq, dim, dtype=dtype)
    k = d.randn(*tokens_lead, hk, dim, dtype=dtype)
    kind = d.draw(st.sampled_from(("separate", "fused")), label="q/k storage")
    if kind == "fused":  # q and k as views of one (..., hq + hk + 1, dim) projection output, NaN in the rest
        buf = torch.full((*tokens_lead, hq + hk + 1, dim), float("nan"), dtype=dtype, device=d.device)
        qv, kv = buf[..., :hq, :], buf[..., hq + 1:, :]
        qv.copy_(q)
        kv.copy_(k)
    else:
        qv, kv = d.place(q, "q", ("contiguous", "offset", "strided")), d.place(k, "k", ("contiguous", "offset"))
    return q, k, qv, kv, half


def _rope_check(d: Data, dtype, q, k, qo, ko, cos, sin, pos):
    dim = q.shape[-1]
    q3, k3 = q.reshape(-1, q.shape[-2], dim), k.reshape(-1, k.shape[-2], dim)
    ref = rope_ref(q3, k3, cos, sin, pos)
    lowp = (None, None) if dtype == torch.float32 else rope_ref(q3, k3, cos, sin, pos, upcast=False)
    for name, o, r, lp in zip(("q", "k"), (qo, ko), ref, lowp):
        testing.assert_close(o.reshape(r.shape), r, lp, dtype=dtype, extra=d.extra(dtype, r), name=name)


def _rope_case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype("rope")
    mode = draw(st.sampled_from(("cu_seqlens", "position_ids", "packed position_ids", "default")), label="positions")
    theta = draw(st.sampled_from((10000.0, 160000.0)), label="theta")
    if mode == "cu_seqlens":
        cu = _split(draw, draw(st.integers(0, 40), label="tokens"), "split")
        q, k, qv, kv, half = _rope_inputs(d, dtype, (cu[-1],))
        pos = _positions(cu, d.device)
        cos, sin = rope_cache(2 * half, max(cu[-1], 1) + draw(st.integers(0, 3), label="extra positions"), theta,
                              device=d.device)
        qo, ko = ops.rope(qv, kv, cos, sin, cu_seqlens=_cu(cu, d.device), backend=backend)
    elif mode == "default":  # (batch, seq, heads, dim), positions 0..seq-1 in every row
        b, n = draw(st.integers(1, 3), label="batch"), draw(st.integers(1, 17), label="seq")
        q, k, qv, kv, half = _rope_inputs(d, dtype, (b, n))
        cos, sin = rope_cache(2 * half, n + draw(st.integers(0, 3), label="extra positions"), theta, device=d.device)
        qo, ko = ops.rope(qv, kv, cos, sin, backend=backend)
        pos = torch.arange(n, device=d.device).repeat(b)
    else:
        lead = (draw(st.integers(1, 40), label="tokens"),) if mode.startswith("packed") else \
            (draw(st.integers(1, 3), label="batch"), draw(st.integers(1, 17), label="seq"))
        q, k, qv, kv, half = _rope_inputs(d, dtype, lead)
        npos = draw(st.integers(1, 300), label="table positions")
        cos, sin = rope_cache(2 * half, npos, theta, device=d.device)
        pid = torch.randint(0, npos, lead, generator=d.gen).to(d.device)
        pid.view(-1)[0] = npos - 1  # the table's last row is reachable
        pid = pid.to(draw(st.sampled_from((torch.int32, torch.int64)), label="position_ids dtype"))
        qo, ko = ops.rope(qv, kv, cos, sin, position_ids=pid, backend=backend)
        pos = pid.reshape(-1).long()
    assert torch.equal(qv, q) and torch.equal(kv, k), "rope wrote into its inputs"
    assert qo.shape == q.shape and ko.shape == k.shape and qo.dtype == ko.dtype == dtype
    _rope_check(d, dtype, q, k, qo, ko, cos, sin, pos)


@pytest.mark.parametrize("backend", _backends("rope"))
def test_rope(backend):
    run(backend, _rope_case)


# ---------------------------------------------------------------- attention
def _head_dims(backend):
    if backend == "triton":
        return (8, 16, 32, 64)
    if backend == "cuda":
        return (32, 64, 96, 128)
    return (1, 3, 8, 20, 64)


def _window(draw):
    kind = draw(st.sampled_from(("none", "int", "pair")), label="window kind")
    if kind == "none":
        return None, (-1, -1)
    if kind == "int":
        w = draw(st.integers(0, 6), label="window")
        return w, (w, w)
    w = (draw(st.integers(0, 6), label="window left"), draw(st.integers(0, 6), label="window right"))
    return w, w


def _qkv(d: Data, dtype, lead, heads, dim):
    """q, k, v of shape (*lead, heads, dim) and views of them: separate (drawn layouts) or one fused projection."""
    q, k, v = (d.randn(*lead, heads, dim, dtype=dtype) for _ in range(3))
    if d.draw(st.sampled_from(("separate", "fused")), label="qkv storage") == "fused":
        buf = torch.full((*lead, 3, heads, dim), float("nan"), dtype=dtype, device=d.device)
        views = buf.unbind(-3)
        for view, t in zip(views, (q, k, v)):
            view.copy_(t)
        return (q, k, v), views
    return (q, k, v), tuple(d.place(t, n, ("contiguous", "offset", "strided")) for t, n in zip((q, k, v), "qkv"))


def _attention_case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype("attention")
    heads, dim = draw(st.integers(1, 2), label="heads"), draw(st.sampled_from(_head_dims(backend)), label="head_dim")
    window, w = _window(draw)
    scale = draw(st.one_of(st.none(), st.floats(0.05, 1.0)), label="scale")
    layout = draw(st.sampled_from(("padded", "masked", "varlen")), label="layout")
    maxlen = 24 if _small(d) else 70
    if layout == "varlen":
        cu = _split(draw, draw(st.integers(0, maxlen), label="tokens"), "split")
        (q, k, v), (qv, kv, vv) = _qkv(d, dtype, (cu[-1],), heads, dim)
        longest = max(b - a for a, b in zip(cu, cu[1:]))
        max_seqlen = draw(st.one_of(st.none(), st.integers(longest, longest + 3)), label="max_seqlen")
        cut = _cu(cu, d.device)
        out = ops.attention(qv, kv, vv, cu_seqlens=cut, max_seqlen=max_seqlen, window=window, scale=scale,
                            backend=backend)
        ref_fn = lambda up: attention_varlen_ref(q, k, v, cut, w, scale, upcast=up)  # noqa: E731
    else:
        b, s = draw(st.integers(1, 3), label="batch"), draw(st.integers(1, maxlen // 2), label="seq")
        (q, k, v), (qv, kv, vv) = _qkv(d, dtype, (b, s), heads, dim)
        mask = None
        if layout == "masked":  # one run of real tokens per row [start, end), empty rows and left padding included
            mask = torch.zeros(b, s, dtype=torch.bool)
            for row in range(b):
                start = draw(st.integers(0, s), label="real start")
                mask[row, start:draw(st.integers(start, s), label="real end")] = True
            mask = mask.to(d.device)
        out = ops.attention(qv, kv, vv, key_padding_mask=mask, window=window, scale=scale, backend=backend)
        ref_fn = lambda up: attention_ref(q, k, v, mask, w, scale, upcast=up)  # noqa: E731
        if mask is not None:
            assert torch.equal(out[~mask], torch.zeros_like(out[~mask])), "padded query rows must be zero"
    assert out.shape == q.shape and out.dtype == dtype
    ref32 = ref_fn(True)
    testing.assert_close(out, ref32.float(), _lowp(dtype, lambda: ref_fn(False)), dtype=dtype,
                         extra=d.extra(dtype, ref32))


@pytest.mark.parametrize("backend", _backends("attention"))
def test_attention(backend):
    run(backend, _attention_case)


# ---------------------------------------------------------------- LoRA
def _rank(d: Data) -> int:
    return d.draw(st.sampled_from((1, 2, 3, 8, 16)), label="rank")


def _features(d: Data, label: str) -> int:
    sizes = (1, 3, 17, 64, 129) if _small(d) else (1, 3, 17, 64, 129, 384, 1001)
    return d.draw(st.sampled_from(sizes), label=label)


def _merge_lora_case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype("merge_lora")
    out_f, in_f, r = _features(d, "out_features"), _features(d, "in_features"), _rank(d)
    adapter_dtype = d.dtype("merge_lora") if draw(st.booleans(), label="adapter dtype differs") else dtype
    w = d.randn(out_f, in_f, dtype=dtype)
    a, b = d.randn(r, in_f, dtype=adapter_dtype), d.randn(out_f, r, dtype=adapter_dtype)
    scale = draw(st.floats(-2.0, 2.0, allow_nan=False), label="scale")
    inplace = draw(st.booleans(), label="inplace")
    wv, av, bv = d.place(w, "weight"), d.place(a, "lora_a"), d.place(b, "lora_b")
    got = ops.merge_lora(wv, av, bv, scale, backend=backend, inplace=inplace)
    if inplace:
        assert got is wv, "merge_lora(inplace=True) must return the weight it wrote"
    else:
        assert torch.equal(wv, w), "merge_lora(inplace=False) wrote into weight"
    ref = merge_lora_ref(w, a, b, scale)
    lowp = _lowp(dtype, lambda: merge_lora_ref(w, a, b, scale, upcast=False))
    testing.assert_close(got, ref.float(), lowp, dtype=dtype, extra=d.extra(dtype, ref))


def _lora_linear_case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype("lora_linear")
    out_f, in_f, r = _features(d, "out_features"), _features(d, "in_features"), _rank(d)
    lead = _lead(d, True)
    x = d.randn(*lead, in_f, dtype=dtype)
    w = d.randn(out_f, in_f, dtype=dtype, scale=1 / math.sqrt(in_f))
    bias = d.randn(out_f, dtype=dtype) if draw(st.booleans(), label="bias") else None
    a, b = d.randn(r, in_f, dtype=dtype, scale=1 / math.sqrt(in_f)), d.randn(out_f, r, dtype=dtype)
    scale = draw(st.floats(-2.0, 2.0, allow_nan=False), label="scale")
    xv, wv, av, bv = d.place(x, "x"), d.place(w, "weight"), d.place(a, "lora_a"), d.place(b, "lora_b")
    got = ops.lora_linear(xv, wv, bias, av, bv, scale, backend=backend)
    assert got.shape == (*lead, out_f) and got.dtype == dtype
    ref = lora_linear_ref(x, w, bias, a, b, scale)
    lowp = _lowp(dtype, lambda: lora_linear_ref(x, w, bias, a, b, scale, upcast=False))
    testing.assert_close(got, ref.float(), lowp, dtype=dtype, extra=d.extra(dtype, ref))


@pytest.mark.parametrize("backend", _backends("merge_lora"))
def test_merge_lora(backend):
    run(backend, _merge_lora_case)


@pytest.mark.parametrize("backend", _backends("lora_linear"))
def test_lora_linear(backend):
    run(backend, _lora_linear_case)


# ---------------------------------------------------------------- cu_seqlens changed in place between calls
# A cu_seqlens tensor rewritten through a numpy view or through .data keeps its _version: a second call must
# still compute on the new split (or refuse invalid values with an error naming cu_seqlens), never reuse what
# it derived from the old values, never read or write out of bounds.
def _rewrite(cu: torch.Tensor, values: list[int], how: str) -> None:
    """Write `values` into cu without bumping cu._version: through a numpy view or through .data."""
    version = cu._version
    if how == "numpy":
        torch.from_numpy(cu.numpy())[:] = torch.tensor(values, dtype=torch.int32)
    else:
        cu.data.copy_(torch.tensor(values, dtype=torch.int32))
    assert cu._version == version and cu.tolist() == values  # the case under test: same tensor, same version


def _invalid(draw, cu: list[int]) -> list[int]:
    """Values of cu's length that cu_seqlens validation must refuse."""
    total, n = cu[-1], len(cu)
    kind = draw(st.sampled_from(("past the end", "short of the end", "decreasing", "negative start")),
                label="invalid kind")
    bad = list(cu)
    if kind == "past the end":
        bad[-1] = total + draw(st.integers(1, 50), label="excess")
    elif kind == "short of the end":
        bad[-1] = total - draw(st.integers(1, total), label="shortfall")
    elif kind == "decreasing":
        bad[n // 2] = total + 7
    else:
        bad[0] = -draw(st.integers(1, 5), label="start")
    return bad


def _inplace_call(d: Data, op: str, total: int, cu: torch.Tensor):
    """(call, check): call() runs `op` on fixed random inputs with `cu`; check(out, split) holds it to the
    reference on `split`."""
    dtype = torch.float16 if d.backend == "cuda" else torch.float32
    if op == "attention":
        dim = 16 if d.backend == "triton" else _head_dims(d.backend)[-1]
        (q, k, v), (qv, kv, vv) = _qkv(d, dtype, (total,), 2, dim)
        call = lambda: ops.attention(qv, kv, vv, cu_seqlens=cu, backend=d.backend)  # noqa: E731
        ref = lambda split, up: attention_varlen_ref(q, k, v, _cu(split, d.device), upcast=up)  # noqa: E731
        check = lambda out, split: testing.assert_close(  # noqa: E731
            out, ref(split, True).float(), _lowp(dtype, lambda: ref(split, False)), dtype=dtype)
        return call, check
    q, k, qv, kv, half = _rope_inputs(d, dtype, (total,))
    cos, sin = rope_cache(2 * half, total + 64, 10000.0, device=d.device)  # a table longer than any sequence
    call = lambda: ops.rope(qv, kv, cos, sin, cu_seqlens=cu, backend=d.backend)  # noqa: E731
    check = lambda out, split: _rope_check(d, dtype, q, k, *out, cos, sin, _positions(split, d.device))  # noqa: E731
    return call, check


def _inplace_case(draw, backend, op: str, how: str, invalid: bool):
    d = Data(draw, backend)
    total = draw(st.integers(1, 40 if _small(d) else 100), label="tokens")
    first = _split(draw, total, "first")
    second = _invalid(draw, first) if invalid else _split(draw, total, "second", len(first) - 1)
    cu = _cu(first, d.device)
    call, check = _inplace_call(d, op, total, cu)
    check(call(), first)
    _rewrite(cu, second, how)
    if invalid:
        with pytest.raises((ValueError, RuntimeError), match="cu_seqlens"):
            call()
    else:
        check(call(), second)


def _inplace_params(op: str) -> list:
    """(backend, how); the numpy view exists for CPU tensors only."""
    return [pytest.param(be, how, id=f"{be}-{how}")
            for be in _backends(op) for how in ("numpy", "data") if how == "data" or testing.device_for(be) == "cpu"]


def _isolated(fn: str, *args) -> None:
    """Run fn(*args) of this file in a fresh interpreter: an out-of-bounds access there must not take the test
    session down. Passes when it returns normally."""
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('props', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); getattr(m, sys.argv[2])(*sys.argv[3:])")
    proc = subprocess.run([sys.executable, "-c", code, __file__, fn, *args], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"{fn}{args} exited with {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}"


def inplace_property(backend: str, op: str, how: str, invalid: str, examples: str = "0") -> None:
    run(backend, lambda draw, be: _inplace_case(draw, be, op, how, invalid == "invalid"), int(examples) or None)


def _inplace_test(backend, op, how, invalid):
    if backend in ("triton", "cuda") and invalid:  # a device kernel fed bad offsets may corrupt the process
        _isolated("inplace_property", backend, op, how, "invalid", "4")
    else:
        inplace_property(backend, op, how, "invalid" if invalid else "valid")


@pytest.mark.parametrize("backend,how", _inplace_params("attention"))
def test_attention_cu_seqlens_changed_in_place(backend, how):
    """Drawn splits of at most 40 tokens under the interpreter (one query tile): the tile-crossing case is
    test_attention_longest_sequence_grows_in_place."""
    _inplace_test(backend, "attention", how, False)


@pytest.mark.parametrize("backend,how", _inplace_params("attention"))
def test_attention_cu_seqlens_invalid_in_place(backend, how):
    _inplace_test(backend, "attention", how, True)


@pytest.mark.parametrize("backend,how", _inplace_params("rope"))
def test_rope_cu_seqlens_changed_in_place(backend, how):
    _inplace_test(backend, "rope", how, False)


@pytest.mark.parametrize("backend,how", _inplace_params("rope"))
def test_rope_cu_seqlens_invalid_in_place(backend, how):
    _inplace_test(backend, "rope", how, True)


@pytest.mark.parametrize("backend,how", _inplace_params("attention"))
def test_attention_longest_sequence_grows_in_place(backend, how):
    """Five sequences of 20 tokens rewritten in place to four empty ones and one of 100 (past a 64-query tile)."""
    d = Data(lambda strategy, label=None: 0, backend)  # no draws: every one takes 0 (seed 0, separate q/k/v)
    first, second = [0, 20, 40, 60, 80, 100], [0, 0, 0, 0, 0, 100]
    cu = _cu(first, d.device)
    call, check = _inplace_call(d, "attention", 100, cu)
    check(call(), first)
    _rewrite(cu, second, how)
    check(call(), second)
