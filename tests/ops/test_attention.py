"""attention: every backend against the fp32 reference under the tolerance rule, over dtype x head dim x
length, variable-length batches, sliding windows, padding masks (down to one real token), padded <=> varlen
equivalence, fallback, and bad input."""
import dataclasses
import warnings

import pytest
import torch

from fastenc import ops, registry, testing
from fastenc.padding import unpad_input
from fastenc.reference.attention import attention_ref, attention_varlen_ref

OP = "attention"
BACKENDS = testing.backends_for(OP)
INTERP = registry.interpreter_on() and not torch.cuda.is_available()


def _dtypes(backend):
    # The Triton interpreter's bf16 tl.dot is wrong: bf16 Triton runs on a GPU only.
    if backend == "triton" and INTERP:
        return (torch.float32, torch.float16)
    return testing.DTYPES


def _inputs(backend, dtype, head_dim=64):
    """The call a case makes, described for the registry: packed q (tokens, heads, head_dim) on the test device."""
    return {"q": testing.fake(17, 2, head_dim, dtype=dtype, device=testing.device_for(backend))}


def _cases():
    """(backend, dtype, head_dim, seqlen): the compiled backends get the full grid; Triton under the
    interpreter a smaller one (its time grows with tile steps); cases a backend cannot serve (its dtypes, head
    dims) are left out by the registry's answer."""
    out = []
    for b in BACKENDS:
        small = b == "triton" and INTERP
        for dt in _dtypes(b):
            dims = (64, 80) if small else (32, 64, 80, 96, 128)
            lens = (1, 17, 129) if small else (1, 17, 129)
            out += [(b, dt, d, n) for d in dims for n in lens]
            out += [(b, dt, d, 17) for d in ((32, 128) if small else (8, 40, 256))]
            out += [(b, dt, 64, n) for n in ((128,) if small else (128, 1000))]
    return testing.cases(OP, out, lambda b, dt, d, n: _inputs(b, dt, d),
                         ids=lambda b, dt, d, n: f"{b}-{testing.dtype_id(dt)}-d{d}-s{n}")


def _qkv(*shape, dtype, device, seed=None):
    g = None if seed is None else seed
    return tuple(testing.randn(*shape, dtype=dtype, device=device, seed=None if g is None else g + i)
                 for i in range(3))


def _check(out, q, k, v, ref_fn, dtype):
    """Tolerance rule: ref32 from the same (rounded) inputs in fp32, ref_lowp in the inputs' precision."""
    ref32 = ref_fn(q, k, v, True)
    lowp = None if dtype == torch.float32 else ref_fn(q, k, v, False)
    testing.assert_close(out, ref32.float(), lowp, dtype=dtype)


@pytest.mark.parametrize("backend,dtype,head_dim,seqlen", _cases())
def test_padded_matches_reference(backend, dtype, head_dim, seqlen):
    device = testing.device_for(backend)
    heads = 2 if seqlen < 1000 else 3
    q, k, v = _qkv(2, seqlen, heads, head_dim, dtype=dtype, device=device)
    out = ops.attention(q, k, v, backend=backend)
    assert out.shape == q.shape and out.dtype == dtype
    _check(out, q, k, v, lambda a, b, c, up: attention_ref(a, b, c, upcast=up), dtype)


@pytest.mark.skipif("cpu" not in BACKENDS, reason="cpu backend not available")
@pytest.mark.parametrize("head_dim", [1, 12, 20, 36, 100])
def test_cpu_odd_head_dims(head_dim):
    """The CPU kernel takes any head dim up to 256: register-transposed 8 x 8 blocks plus scalar edges."""
    lens = [17, 129, 200, 8, 3]
    cu = _cu(lens, "cpu")
    q, k, v = _qkv(sum(lens), 3, head_dim, dtype=torch.float32, device="cpu")
    out = ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=max(lens), backend="cpu")
    _check(out, q, k, v, lambda a, b, c, up: attention_varlen_ref(a, b, c, cu, upcast=up), torch.float32)


def _varlen_lens(backend):
    return [1, 17, 129, 40] if backend == "triton" and INTERP else [1, 17, 129, 64, 300, 2]


def _cu(lens, device):
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    return cu.to(device)


@pytest.mark.parametrize("backend,dtype", testing.dtype_cases(OP, _dtypes, _inputs))
def test_varlen_matches_reference(backend, dtype):
    device = testing.device_for(backend)
    lens = _varlen_lens(backend)
    cu = _cu(lens, device)
    q, k, v = _qkv(sum(lens), 3, 64, dtype=dtype, device=device)
    out = ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=max(lens), scale=0.2, backend=backend)
    _check(out, q, k, v, lambda a, b, c, up: attention_varlen_ref(a, b, c, cu, scale=0.2, upcast=up), dtype)


WINDOWS = [64, (64, 64), (0, 5), (7, 0), (3, 20), (0, 0), (500, 2)]


def _window_dtypes(backend, window):
    # cuda (fp16/bf16 only) runs every window in both of its dtypes; elsewhere fp32, and fp16 for one window.
    if backend == "cuda":
        return (torch.float16, torch.bfloat16)
    return (torch.float16,) if backend != "reference" and window == (64, 64) else (torch.float32,)


def _window_id(b, w, dt):
    return f"{b}-w{w if isinstance(w, int) else '%d_%d' % w}-{testing.dtype_id(dt)}"


WINDOW_CASES = testing.cases(OP, ((b, w, dt) for b in BACKENDS for w in WINDOWS for dt in _window_dtypes(b, w)),
                             lambda b, w, dt: _inputs(b, dt), ids=_window_id)


@pytest.mark.parametrize("backend,window,dtype", WINDOW_CASES)
def test_window_matches_reference(backend, window, dtype):
    device = testing.device_for(backend)
    small = backend == "triton" and INTERP
    lens = [129, 1, 70] if small else [300, 1, 129, 64]
    wl, wr = (window, window) if isinstance(window, int) else window
    cu = _cu(lens, device)
    q, k, v = _qkv(sum(lens), 2, 64, dtype=dtype, device=device)
    out = ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=max(lens), window=window, backend=backend)
    _check(out, q, k, v, lambda a, b, c, up: attention_varlen_ref(a, b, c, cu, (wl, wr), upcast=up), dtype)


def _mask(rows, seqlen, device):
    m = torch.zeros(len(rows), seqlen, dtype=torch.bool)
    for i, (a, e) in enumerate(rows):
        m[i, a:e] = True
    return m.to(device)


@pytest.mark.parametrize("backend", testing.backend_cases(OP, lambda b: _inputs(b, torch.float32)))
@pytest.mark.parametrize("window", [None, (4, 4)], ids=["nowindow", "w4_4"])
def test_mask_single_real_token_and_padded_rows_zero(backend, window):
    """Rows with one real token (first, middle, last position), a left-padded row, a full row, an empty row."""
    device = testing.device_for(backend)
    seqlen = 33
    rows = [(0, 1), (5, 6), (32, 33), (3, 33), (0, 33), (0, 0)]
    mask = _mask(rows, seqlen, device)
    q, k, v = _qkv(len(rows), seqlen, 2, 64, dtype=torch.float32, device=device)
    out = ops.attention(q, k, v, key_padding_mask=mask, window=window, backend=backend)
    assert torch.equal(out[~mask], torch.zeros_like(out[~mask])), "padded query rows must be exactly zero"
    w = (-1, -1) if window is None else window
    ref = attention_ref(q, k, v, mask, w)
    # A query's window is counted in real tokens; left padding shifts every position alike, so the padded-
    # layout reference (positions in the padded row) agrees.
    testing.assert_close(out, ref)
    # One real token attends to itself only: out = v.
    testing.assert_close(out[0, 0], v[0, 0])
    testing.assert_close(out[1, 5], v[1, 5])


@pytest.mark.parametrize("backend,dtype", testing.dtype_cases(OP, _dtypes, _inputs))
def test_padded_equals_varlen(backend, dtype):
    device = testing.device_for(backend)
    seqlen = 70 if backend == "triton" and INTERP else 150
    rows = [(0, seqlen), (0, 1), (0, 37), (0, seqlen - 1)]
    mask = _mask(rows, seqlen, device)
    q, k, v = _qkv(len(rows), seqlen, 2, 64, dtype=dtype, device=device)
    padded = ops.attention(q, k, v, key_padding_mask=mask, backend=backend)
    idx, cu, longest = unpad_input(mask)
    flat = [t.reshape(-1, 2, 64)[idx] for t in (q, k, v)]
    packed = ops.attention(*flat, cu_seqlens=cu, max_seqlen=longest, backend=backend)
    testing.assert_close(padded.reshape(-1, 2, 64)[idx], packed.float(), dtype=dtype)
    assert torch.equal(padded[~mask], torch.zeros_like(padded[~mask]))


@pytest.mark.parametrize("backend", testing.backend_cases(OP, lambda b: _inputs(b, torch.float32, 32)))
def test_empty_batch_and_noncontiguous_inputs(backend):
    device = testing.device_for(backend)
    q, k, v = _qkv(2, 0, 2, 64, dtype=torch.float32, device=device)
    assert ops.attention(q, k, v, backend=backend).shape == (2, 0, 2, 64)
    # (batch, heads, seq, dim) storage viewed as (batch, seq, heads, dim): a strided input.
    q, k, v = (t.transpose(1, 2) for t in _qkv(2, 2, 19, 32, dtype=torch.float32, device=device))
    out = ops.attention(q, k, v, backend=backend)
    testing.assert_close(out, attention_ref(q, k, v))


def test_cpu_unavailable_falls_back_with_one_warning(monkeypatch):
    impl = registry.impls(OP)["cpu"]
    monkeypatch.setitem(registry._REGISTRY[OP], "cpu",
                        dataclasses.replace(impl, available=lambda: "no C++ compiler found ('c++' not on PATH)"))
    monkeypatch.setattr(registry, "_WARNED", set())
    monkeypatch.delenv("FASTENC_BACKEND", raising=False)
    q, k, v = _qkv(1, 9, 2, 32, dtype=torch.float32, device="cpu")
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler"):
        out = ops.attention(q, k, v)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ops.attention(q, k, v)
    testing.assert_close(out, attention_ref(q, k, v))
    with pytest.raises(ValueError, match="no C\\+\\+ compiler"):
        ops.attention(q, k, v, backend="cpu")


def test_custom_op_has_fake_and_traces():
    q, k, v = _qkv(2, 5, 2, 32, dtype=torch.float32, device="cpu")
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    torch.library.opcheck(torch.ops.fastenc.attention.default,
                          (q.reshape(10, 2, 32), k.reshape(10, 2, 32), v.reshape(10, 2, 32), cu, 6, -1, -1, 0.5,
                           "reference"), test_utils=("test_schema", "test_faketensor"))


# ---------------------------------------------------------------- bad input
def _bad(**kw):
    q, k, v = _qkv(2, 8, 2, 32, dtype=torch.float32, device="cpu")
    args = {"q": q, "k": k, "v": v}
    args.update({n: kw.pop(n) for n in ("q", "k", "v") if n in kw})
    return ops.attention(args["q"], args["k"], args["v"], **kw)


def _packed(total=10, dtype=torch.float32):
    return _qkv(total, 2, 32, dtype=dtype, device="cpu")


@pytest.mark.parametrize("case,match", [
    ("shape", r"q, k, v must have the same shape.*k \(2, 8, 2, 16\)"),
    ("dtype", r"q, k, v must have the same dtype"),
    ("rank", r"q must be \(batch, seq, heads, head_dim\)"),
    ("neg_window", r"window .*>= 0, or -1 for unbounded.*left=-2"),
    ("neg_window_int", r"window .*>= 0.*left=-3"),
    ("mask_and_cu", r"key_padding_mask .* or cu_seqlens .*not both"),
    ("cu_dtype", r"cu_seqlens must be int32, got int64"),
    ("cu_start", r"cu_seqlens must start at 0, got 1"),
    ("cu_order", r"cu_seqlens must be non-decreasing"),
    ("cu_end", r"cu_seqlens must end at total_tokens=10, got 9"),
    ("max_seqlen", r"max_seqlen must be an int >= the longest sequence \(6\), got 5"),
    ("mask_shape", r"key_padding_mask must have shape"),
    ("head_dim_cpu", r"head_dim must be in \[1, 256\], got 264"),
    ("head_dim_triton", r"head_dim must be a multiple of 8 .*got 12"),
])
def test_bad_input_raises_value_error(case, match):
    q, k, v = _packed()
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match=match):
        if case == "shape":
            _bad(k=torch.randn(2, 8, 2, 16))
        elif case == "dtype":
            _bad(v=torch.randn(2, 8, 2, 32, dtype=torch.float16))
        elif case == "rank":
            _bad(q=torch.randn(8, 2, 32), k=torch.randn(8, 2, 32), v=torch.randn(8, 2, 32))
        elif case == "neg_window":
            _bad(window=(-2, 4))
        elif case == "neg_window_int":
            _bad(window=-3)
        elif case == "mask_and_cu":
            _bad(key_padding_mask=torch.ones(2, 8, dtype=torch.bool), cu_seqlens=cu)
        elif case == "cu_dtype":
            ops.attention(q, k, v, cu_seqlens=cu.long())
        elif case == "cu_start":
            ops.attention(q, k, v, cu_seqlens=torch.tensor([1, 4, 10], dtype=torch.int32))
        elif case == "cu_order":
            ops.attention(q, k, v, cu_seqlens=torch.tensor([0, 6, 4, 10], dtype=torch.int32))
        elif case == "cu_end":
            ops.attention(q, k, v, cu_seqlens=torch.tensor([0, 4, 9], dtype=torch.int32))
        elif case == "max_seqlen":
            ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=5)
        elif case == "mask_shape":
            _bad(key_padding_mask=torch.ones(2, 7, dtype=torch.bool))
        elif case == "head_dim_cpu":
            x = torch.randn(1, 3, 1, 264)
            ops.attention(x, x, x, backend="cpu")
        elif case == "head_dim_triton":
            x = torch.randn(1, 3, 1, 12)
            ops.attention(x, x, x, backend="triton")


# ---------------------------------------------------------------- Triton launch configuration
def test_triton_config_heuristic_and_autotune_cache(monkeypatch, tmp_path):
    from fastenc.kernels import attention as ka

    for cc in (80, 90):
        for d in (32, 64, 80, 96, 128, 256):
            for dt in testing.DTYPES:
                cfg = ka.default_config(d, dt, cc)
                assert cfg.block_m in (16, 32, 64, 128) and cfg.block_n in (16, 32, 64, 128) and cfg.num_warps in (4, 8)
                assert cfg in ka.candidate_configs(d, dt, cc) or dt == torch.float32
    with pytest.raises(dataclasses.FrozenInstanceError):
        ka.default_config(64, torch.float16, 90).block_m = 1
    # The on-disk cache round-trips and is what a later process reads.
    monkeypatch.setenv("FASTENC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ka, "_TUNED", None)
    monkeypatch.setattr(ka.triton.testing, "do_bench", lambda fn, **kw: 1.0 if fn() is None else 2.0)
    calls = []
    best = ka._autotune("sm90|bfloat16|d64|s512|w0", lambda cfg: calls.append(cfg), 64, torch.bfloat16, 90)
    assert best == calls[0] and len(calls) == len(ka.candidate_configs(64, torch.bfloat16, 90))
    monkeypatch.setattr(ka, "_TUNED", None)
    assert ka._load_tuned()["sm90|bfloat16|d64|s512|w0"] == best
    assert (tmp_path / "attention_autotune.json").exists()


# ---------------------------------------------------------------- GPU code generation (no GPU needed)
_COMPILE = """
import json
from fastenc.kernels._compile import compile_for
from fastenc.kernels.attention import compile_specs
specs = {s["name"]: s for s in compile_specs()}
for name, cc in (("attention_fp16_d64_cfg90", 90), ("attention_bf16_d128_cfg90", 90),
                 ("attention_bf16_d64_window_cfg90", 90), ("attention_bf16_d64_window_cfg80", 80),
                 ("attention_fp16_d128_cfg80", 80), ("attention_fp32_d64_cfg90", 80),
                 ("attention_fp16_d8_cfg90", 90), ("attention_fp32_d8_cfg90", 80)):
    print(json.dumps(compile_for(specs[name], cc)))
"""


def test_triton_kernel_compiles_for_sm90_sm80_without_spills():
    """The heuristic's launch configs, compiled by the real Triton JIT for Hopper and Ampere (ptxas -v); head dim
    8 is padded to a 16-wide tl.dot (NVIDIA rejects K = 8)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    res = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(ln) for ln in res.stdout.splitlines() if ln.startswith("{")]
    assert len(rows) == 8
    for r in rows:
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, r
        assert r["registers"] <= 255, r


def test_cu_seqlens_changed_in_place_is_checked_again():
    """cu_seqlens is validated on every call: an in-place change is seen and rejected."""
    q, k, v = _qkv(9, 2, 16, dtype=torch.float32, device="cpu")
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=5, backend="reference")
    ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=5, backend="reference")
    cu[1] = 7
    with pytest.raises(ValueError, match="max_seqlen must be an int >= the longest sequence"):
        ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=5, backend="reference")
    cu[2] = 8
    with pytest.raises(ValueError, match="end at total_tokens=9"):
        ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=9, backend="reference")
    with torch.inference_mode():  # inference tensors (no version counter) alike
        cu_inf = torch.tensor([0, 4, 9], dtype=torch.int32)
        ops.attention(q, k, v, cu_seqlens=cu_inf, max_seqlen=5, backend="reference")
        cu_inf[2] = 8
        with pytest.raises(ValueError, match="end at total_tokens=9"):
            ops.attention(q, k, v, cu_seqlens=cu_inf, max_seqlen=9, backend="reference")
