"""attention: memory safety and integer edges. cu_seqlens is validated on every call (a value changed behind the
version counter is seen) and the kernels get the longest length read then; every kernel stays inside its tensors
whatever cu_seqlens holds; the Triton grid takes any number of sequences and every head dim it accepts compiles;
windows at the integer edges; NaN propagates as in the reference, which hides none; the dispatch layer does
not depend on the models."""
import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from fastenc import ops, registry, testing
from fastenc.reference.attention import attention_ref, attention_varlen_ref

OP = "attention"
BACKENDS = testing.backends_for(OP)
INTERP = registry.interpreter_on() and not torch.cuda.is_available()
ROOT = Path(__file__).resolve().parents[2]


def _qkv(total, heads, head_dim, device="cpu", dtype=torch.float32):
    return tuple(testing.randn(total, heads, head_dim, dtype=dtype, device=device) for _ in range(3))


def _poison_empty_like(monkeypatch):
    """torch.empty_like returns NaN-filled tensors: an output row a kernel leaves unwritten fails the comparison."""
    real = torch.empty_like

    def poisoned(t, *a, **kw):
        out = real(t, *a, **kw)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty_like", poisoned)


# ---------------------------------------------------------------- cu_seqlens: validated on every call
@pytest.mark.parametrize("how", ["numpy", "data"])
def test_cu_seqlens_changed_behind_version_counter_is_rejected(how):
    """Writes through numpy or .data do not bump _version: a remembered "valid" tensor would be used unchecked."""
    q, k, v = _qkv(9, 2, 16)
    arr = np.array([0, 4, 9], dtype=np.int32)
    cu = torch.from_numpy(arr)
    ops.attention(q, k, v, cu_seqlens=cu, backend="reference")
    version = cu._version
    if how == "numpy":
        arr[1] = 100
    else:
        cu.data[1] = 100
    assert cu._version == version  # the change is invisible to the version counter
    with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
        ops.attention(q, k, v, cu_seqlens=cu, backend="reference")


@pytest.mark.parametrize("backend", BACKENDS)
def test_cu_seqlens_resplit_in_place_same_total(backend, monkeypatch):
    """A cu_seqlens re-split behind the version counter (same total, a longer longest sequence): a stale
    max_seqlen is rejected, and without one every row is computed from the current values."""
    device = testing.device_for(backend)
    arr = np.array([0, 30, 60, 90], dtype=np.int32)
    cu = torch.from_numpy(arr)
    q, k, v = _qkv(90, 1, 16)
    ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=30, backend="reference")
    arr[:] = [0, 10, 80, 90]
    with pytest.raises(ValueError, match=r"max_seqlen must be an int >= the longest sequence \(70\), got 30"):
        ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=30, backend="reference")
    _poison_empty_like(monkeypatch)
    cu_d = cu.to(device)
    q, k, v = (t.to(device) for t in (q, k, v))
    out = ops.attention(q, k, v, cu_seqlens=cu_d, backend=backend)
    testing.assert_close(out, attention_varlen_ref(q, k, v, cu_d))


# ---------------------------------------------------------------- the kernels on their own
def _triton_fwd():
    if "triton" not in BACKENDS:
        pytest.skip("triton backend not available")
    from fastenc.kernels import attention as ka

    return ka


@pytest.mark.parametrize("cu_values", [[0, 5, 60], [0, 5, -40], [0, 25, 12, 20], [-30, 5, 20], [0, 5, 2 ** 31 - 1]],
                         ids=["past_end", "negative_end", "decreasing", "negative_start", "int32_max"])
def test_triton_kernel_stays_inside_its_tensors_with_bad_cu_seqlens(cu_values, monkeypatch):
    """cu_seqlens that was never validated (or changed since): the kernel clamps every value it reads to
    [0, total], so no load or store leaves the tensors. They sit inside larger buffers whose guard rows must come
    back untouched; the sequence before the bad value is still right."""
    ka = _triton_fwd()
    device = testing.device_for("triton")
    total, guard, h, d = 20, 64, 1, 16
    bufs = [torch.full((guard + total + guard, h, d), float("nan"), device=device) for _ in range(3)]
    q, k, v = (b[guard:guard + total] for b in bufs)
    for t in (q, k, v):
        t.copy_(testing.randn(total, h, d, device=device))
    out_buf = torch.full((guard + total + guard, h, d), 7.0, device=device)
    monkeypatch.setattr(torch, "empty_like", lambda t, *a, **kw: out_buf[guard:guard + total])
    cu = torch.tensor(cu_values, dtype=torch.int32, device=device)
    out, _ = ka.attention_fwd(q, k, v, cu, 5, -1, -1, 0.25)
    assert out.data_ptr() == out_buf[guard:].data_ptr()
    assert torch.equal(out_buf[:guard], torch.full_like(out_buf[:guard], 7.0)), "wrote before the output"
    assert torch.equal(out_buf[guard + total:], torch.full_like(out_buf[:guard], 7.0)), "wrote past the output"
    if cu_values[:2] == [0, 5]:
        cu5 = torch.tensor([0, 5], dtype=torch.int32, device=device)
        testing.assert_close(out[:5], attention_varlen_ref(q[:5], k[:5], v[:5], cu5, scale=0.25))


@pytest.mark.skipif("cpu" not in BACKENDS, reason="cpu backend not available")
@pytest.mark.parametrize("cu_values", [[0, 5, 60], [0, 25, 12, 20], [-30, 5, 20]])
def test_cpu_kernel_rejects_bad_cu_seqlens(cu_values):
    from fastenc import extension

    q, k, v = _qkv(20, 1, 16)
    with pytest.raises((ValueError, RuntimeError), match="cu_seqlens"):
        extension.load().attention(q, k, v, torch.tensor(cu_values, dtype=torch.int32), 5, -1, -1, 0.25)


# ---------------------------------------------------------------- Triton: head dims and the grid
def test_triton_block_d_at_least_16_and_compile_specs_cover_every_head_dim():
    """tl.dot needs K >= 16 on NVIDIA GPUs: head dim 8 is padded to 16. compile_specs() (the sm_80/sm_90 compile
    check) covers every BLOCK_D of every head dim the backend accepts, in half precision and in fp32."""
    ka = _triton_fwd()
    assert ka.block_d(8) == 16 and ka.block_d(24) == 32 and ka.block_d(136) == 256
    accepted = [d for d in range(1, 300) if not registry.impls(OP)["triton"].check(
        {"q": torch.empty(1, 1, d), "k": torch.empty(1, 1, d), "v": torch.empty(1, 1, d)})]
    assert accepted == list(range(8, 257, 8))
    needed = {ka.block_d(d) for d in accepted}
    assert needed == {16, 32, 64, 128, 256}
    specs = ka.compile_specs()
    for ieee in (False, True):
        have = {s["constexprs"]["BLOCK_D"] for s in specs if s["constexprs"]["IEEE"] == ieee}
        assert needed <= have, (ieee, needed - have)
    for s in specs:
        assert s["constexprs"]["BLOCK_D"] == ka.block_d(s["constexprs"]["D"]) >= 16


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton backend not available")
@pytest.mark.parametrize("head_dim", [8, 24])
def test_triton_small_head_dims_match_reference(head_dim):
    device = testing.device_for("triton")
    cu = torch.tensor([0, 1, 18, 40], dtype=torch.int32, device=device)
    q, k, v = _qkv(40, 2, head_dim, device)
    out = ops.attention(q, k, v, cu_seqlens=cu, backend="triton")
    testing.assert_close(out, attention_varlen_ref(q, k, v, cu))


def test_triton_grid_takes_more_sequences_than_grid_y_and_z_allow():
    """70,000 sequences: the batch folds into grid axis 0 (up to 2**31 - 1); y holds the heads (<= 65,535)."""
    ka = _triton_fwd()
    for block_m in (16, 64, 128):
        m_blocks, grid = ka.launch_grid(1, 70_000, 70_000, 12, block_m)
        assert m_blocks == 1 and grid == (70_000, 12)
        m_blocks, grid = ka.launch_grid(129, 70_000 * 129, 70_000, 2, block_m)
        assert m_blocks == math.ceil(129 / block_m) and grid == (70_000 * m_blocks, 2)
        assert len(grid) == 2 and grid[0] <= 2 ** 31 - 1 and grid[1] <= ka.GRID_Y_MAX
    # A max_seqlen past total_tokens sizes nothing bigger than the tokens.
    assert ka.launch_grid(10 ** 12, 100, 4, 1, 64) == (2, (8, 1))
    with pytest.raises(ValueError, match="heads must be <= 65535, got 70000"):
        ka.launch_grid(1, 10, 10, 70_000, 64)
    with pytest.raises(ValueError, match="exceed the grid"):
        ka.launch_grid(2 ** 20, 2 ** 30, 2 ** 20, 1, 16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_one_token_sequences(backend):
    """One-token sequences attend to themselves only: out = v. 70,000 of them on the compiled backends (and Triton
    on a GPU), 3,000 on the reference (a Python loop per sequence), 200 under the Triton interpreter (a Python
    step per program; the 70,000-sequence grid itself is checked through launch_grid above)."""
    device = testing.device_for(backend)
    n = 200 if backend == "triton" and INTERP else 3_000 if backend == "reference" else 70_000
    cu = torch.arange(n + 1, dtype=torch.int32, device=device)
    q, k, v = _qkv(n, 1, 16, device)
    out = ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=1, backend=backend)
    testing.assert_close(out, v)


# ---------------------------------------------------------------- windows at the integer edges
def _windows_case(backend):
    device = testing.device_for(backend)
    cu = torch.tensor([0, 17, 18, 60], dtype=torch.int32, device=device)
    return cu, _qkv(60, 2, 16, device)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("window,same_as", [
    (2 ** 63 - 1, (-1, -1)), ((2 ** 63 - 1, 3), (-1, 3)), ((3, 2 ** 63 - 1), (3, -1)), ((42, 42), (-1, -1)),
    ((-1, 5), (-1, 5)), ((5, -1), (5, -1)), (-1, (-1, -1)), ((-1, -1), (-1, -1))],
    ids=["int64_max", "int64_max_left", "int64_max_right", "longer_than_every_seq", "fa_left_unbounded",
         "fa_right_unbounded", "int_minus_one", "pair_minus_one"])
def test_window_edges_match_reference(backend, window, same_as):
    """A side >= the longest sequence, or FlashAttention's -1, is unbounded on that side."""
    cu, (q, k, v) = _windows_case(backend)
    out = ops.attention(q, k, v, cu_seqlens=cu, window=window, backend=backend)
    testing.assert_close(out, attention_varlen_ref(q, k, v, cu, same_as))
    # the reference agrees with itself at the edge (no i + right overflow in its band)
    testing.assert_close(attention_varlen_ref(q, k, v, cu, window if isinstance(window, tuple) else (window,) * 2),
                         attention_varlen_ref(q, k, v, cu, same_as))


@pytest.mark.parametrize("window,exc,match", [
    (2 ** 64, ValueError, r"window sizes must be at most 2\*\*63-1, got \(left=18446744073709551616"),
    ((3, 2 ** 63), ValueError, r"window sizes must be at most 2\*\*63-1"),
    ((-2, 3), ValueError, r"window sizes must be >= 0, or -1 for unbounded, got \(left=-2, right=3\)"),
    ((3, -5), ValueError, r"window sizes must be >= 0, or -1 for unbounded, got \(left=3, right=-5\)"),
    (-3, ValueError, r"window sizes must be >= 0, or -1 for unbounded"),
    (2.5, TypeError, r"window must be an int or a \(left, right\) pair of ints, got 2.5"),
    (True, TypeError, r"window must be an int or a \(left, right\) pair, got bool"),
])
def test_window_bad_values_name_window(window, exc, match):
    q, k, v = _qkv(10, 1, 16)
    with pytest.raises(exc, match=match):
        ops.attention(q, k, v, cu_seqlens=torch.tensor([0, 10], dtype=torch.int32), window=window)


# ---------------------------------------------------------------- NaN: the reference is an oracle
def test_reference_propagates_nan_and_zeroes_only_rows_without_keys():
    q, k, v = (t.view(1, 6, 1, 8) for t in _qkv(6, 1, 8))
    qn = q.clone()
    qn[0, 2, 0, 0] = float("nan")
    out = attention_ref(qn, k, v)
    assert torch.isnan(out[0, 2]).all() and torch.isfinite(out[0, [0, 1, 3, 4, 5]]).all()
    kn = k.clone()
    kn[0, 4, 0, 3] = float("nan")
    assert torch.isnan(attention_ref(q, kn, v)).all()
    ki = k.clone()
    ki[0, 1] = float("inf")
    assert torch.isnan(attention_ref(q, ki, v)).all()  # softmax of +inf: inf - inf, as in SDPA
    # SDPA's math backend agrees (torch's fused CPU kernel returns zeros for a NaN query row instead).
    with sdpa_kernel(SDPBackend.MATH):
        sdpa = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (qn, k, v)))
    assert torch.equal(torch.isnan(sdpa.transpose(1, 2)), torch.isnan(attention_ref(qn, k, v)))
    # a row with no visible key is zero, not NaN
    mask = torch.tensor([[True, True, False, False, False, False]])
    out = attention_ref(q, k, v, mask, window=(0, 0))
    assert torch.isfinite(out).all() and torch.equal(out[0, 2:], torch.zeros_like(out[0, 2:]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_nan_input_propagates_like_the_reference(backend, where):
    """NaN in one query row: that row (and head) only; in one key or value of a sequence: every row of that
    sequence and head (no window), the other sequence and head untouched. Every backend agrees with the
    reference on which outputs are NaN."""
    device = testing.device_for(backend)
    cu = torch.tensor([0, 17, 40], dtype=torch.int32, device=device)
    q, k, v = _qkv(40, 2, 16, device)
    t = {"q": q, "k": k, "v": v}[where]
    t[20, 1, 5] = float("nan")
    out = ops.attention(q, k, v, cu_seqlens=cu, backend=backend).float().cpu()
    ref = attention_varlen_ref(q, k, v, cu).float().cpu()
    expect = torch.zeros(40, 2, dtype=torch.bool)
    if where == "q":
        expect[20, 1] = True
    else:
        expect[17:, 1] = True
    assert torch.equal(torch.isnan(ref).any(-1), expect)
    assert torch.equal(torch.isnan(out).any(-1), expect)
    testing.assert_close(out[~expect], ref[~expect])


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_at_padded_positions_is_never_read(backend):
    """NaN in q, k and v at padded positions: the padded layout never reads them (output rows there are zero)."""
    device = testing.device_for(backend)
    mask = torch.tensor([[True] * 5 + [False] * 4, [True] * 9], device=device)
    q, k, v = (t.view(2, 9, 1, 16) for t in _qkv(18, 1, 16, device))
    for t in (q, k, v):
        t[0, 5:] = float("nan")
    out = ops.attention(q, k, v, key_padding_mask=mask, backend=backend)
    ref = attention_ref(q, k, v, mask)
    assert torch.isfinite(ref).all() and torch.isfinite(out).all()
    testing.assert_close(out, ref)


# ---------------------------------------------------------------- other bad input
@pytest.mark.parametrize("max_seqlen,exc,match", [
    (True, TypeError, "max_seqlen must be an int, got bool"),
    (7.0, TypeError, "max_seqlen must be an int, got float"),
    (torch.tensor([7, 8]), TypeError, "max_seqlen must be an int, got Tensor"),
    (-1, ValueError, r"max_seqlen must be an int >= the longest sequence \(6\), got -1"),
])
def test_bad_max_seqlen(max_seqlen, exc, match):
    q, k, v = _qkv(10, 1, 16)
    with pytest.raises(exc, match=match):
        ops.attention(q, k, v, cu_seqlens=torch.tensor([0, 4, 10], dtype=torch.int32), max_seqlen=max_seqlen)


def test_max_seqlen_accepts_integer_like_and_any_bound():
    q, k, v = _qkv(10, 1, 16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    ref = attention_varlen_ref(q, k, v, cu)
    for m in (np.int64(6), 6, 2 ** 40):
        testing.assert_close(ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=m, backend="reference"), ref)


def test_cu_seqlens_on_another_device():
    q, k, v = _qkv(10, 1, 16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="cu_seqlens must be on q's device cpu, got meta"):
        ops.attention(q, k, v, cu_seqlens=cu)


@pytest.mark.parametrize("cu,match", [
    (torch.tensor([[0, 10]], dtype=torch.int32), r"cu_seqlens must be 1-D of length batch\+1 >= 2, got shape \(1, 2\)"),
    (torch.tensor([0], dtype=torch.int32), r"cu_seqlens must be 1-D of length batch\+1 >= 2, got shape \(1,\)"),
    ([0, 10], "cu_seqlens must be a torch.Tensor, got list"),
])
def test_bad_cu_seqlens_shape_and_type(cu, match):
    q, k, v = _qkv(10, 1, 16)
    with pytest.raises((ValueError, TypeError), match=match):
        ops.attention(q, k, v, cu_seqlens=cu)


# ---------------------------------------------------------------- layering
def test_dispatch_layer_does_not_import_the_models():
    """fastenc.ops never imports fastenc.models (unpad_input and pad_input live in fastenc.padding)."""
    for path in sorted((ROOT / "fastenc" / "ops").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            assert not any(n == "fastenc.models" or n.startswith("fastenc.models.") for n in names), path.name
