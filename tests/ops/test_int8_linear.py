"""The int8 GEMM's kernels against the integer reference: on every instruction-set path this CPU runs (the others
skipped with the reason), the u8 x s8 sums bit for bit over odd shapes and extreme codes (vpmaddubsw's int16
saturation included), the per-row quantization and the packing byte for byte, the dequantizing epilogue within fp32
rounding and identical on every path; the path the dispatcher picks; bad input. The public op's property tests are
in op_samples/int8_linear.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastenc import extension, ops, testing
from fastenc.quant import isa as isa_mod
from fastenc.quant import pack_int8
from fastenc.reference.int8_linear import (int8_epilogue_ref, int8_matmul_ref, kpad, pack_int8_ref, quantize_rows_ref,
                                           quantize_weight_ref, unpack_int8_ref)

SHAPES = [(1, 1, 1), (7, 45, 63), (129, 100, 130), (33, 31, 384), (17, 1, 1001), (40, 96, 64), (1, 77, 3072)]


@pytest.fixture(scope="module")
def ext():
    why = extension.cpu_available()
    if why:
        pytest.skip(f"the cpu extension cannot load here: {why}")
    return extension.load()


def _paths():
    return [pytest.param(name, id=name) for name in isa_mod.ISAS]


def _need(ext, name):
    why = dict(ext.int8_isas())[name]
    if why:
        pytest.skip(f"{name}: {why}")


def _codes(m, k, g, extreme=False):
    """(m, k) u8 codes in [1, 255] padded as the kernels read them: (mpad, kpad), pad columns 128."""
    q = torch.full((-(-m // 32) * 32, kpad(k)), 128, dtype=torch.uint8)
    q[:m, :k] = torch.randint(1, 256, (m, k), generator=g, dtype=torch.int32).to(torch.uint8)
    if extreme and m >= 3:
        q[0, :k], q[1, :k], q[2, :k] = 255, 1, 0  # the largest products; 0 is outside quantize's range but exact too
    return q


def _weights(n, k, g, extreme=False):
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int32).to(torch.int8)
    if extreme and n >= 2:
        w[0], w[1] = 127, -127
    return w


@pytest.mark.parametrize("path", _paths())
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_integer_sums_bit_exact(ext, path, m, n, k):
    _need(ext, path)
    g = testing.generator()
    q, wq = _codes(m, k, g, extreme=True), _weights(n, k, g, extreme=True)
    packed = ext.int8_pack(wq, torch.ones(n))
    got = ext.int8_gemm_raw(q, m, packed, n, k, path)
    assert torch.equal(got, int8_matmul_ref(q[:m, :k], wq))


@pytest.mark.parametrize("asym", [True, False], ids=["asym", "sym"])
def test_row_quantization_matches_the_reference_bit_for_bit(ext, asym):
    x = testing.randn(67, 1001, scale=3.0)
    x[3] = 0  # a row of zeros: scale 1
    x[4] = x[4].abs()  # one-signed rows: the zero point at an end of the range
    x[5] = -x[5].abs()
    x[6, :17] = 1e-30  # tiny values
    q, scale, zero = ext.int8_quantize_rows(x, asym)
    rq, rscale, rzero = quantize_rows_ref(x, asym)
    assert torch.equal(q[:67, :1001], rq) and torch.equal(scale, rscale) and torch.equal(zero, rzero)
    assert bool((q[:67, 1001:] == 128).all()), "pad columns must hold the code of zero (128)"
    deq = (q[:67, :1001].float() - zero[:, None].float()) * scale[:, None]
    assert float((deq - x).abs().max(1).values.div(scale).max()) <= 0.5 + 1e-3  # half a step at most


def test_non_finite_rows_give_nan_scales(ext):
    x = testing.randn(4, 70)
    x[1, 5], x[2, 9] = float("nan"), float("inf")
    for asym in (True, False):
        _, scale, _ = ext.int8_quantize_rows(x, asym)
        assert scale.isnan().tolist() == [False, True, True, False]
        assert quantize_rows_ref(x, asym)[1].isnan().tolist() == [False, True, True, False]


@pytest.mark.parametrize("n,k", [(1, 1), (45, 130), (100, 3072), (33, 64)])
def test_packing_matches_the_reference_byte_for_byte(ext, n, k):
    w = testing.randn(n, k)
    wq, scale = quantize_weight_ref(w)
    packed = ext.int8_pack(wq, scale)
    assert torch.equal(packed, pack_int8_ref(wq, scale))
    back_w, back_s, colsum = unpack_int8_ref(packed, n, k)
    assert torch.equal(back_w, wq) and torch.equal(back_s, scale) and torch.equal(colsum, wq.int().sum(1).int())
    assert torch.equal(pack_int8(w), packed)


def test_weight_quantization_is_per_channel_symmetric():
    w = testing.randn(9, 50)
    w[2] = 0
    wq, scale = quantize_weight_ref(w)
    assert int(wq.abs().amax()) == 127 and int(wq[2].abs().max()) == 0 and float(scale[2]) == 1.0
    assert torch.all((wq.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-7)


@pytest.mark.parametrize("gelu", [None, "none", "tanh"])
@pytest.mark.parametrize("accumulate", [False, True], ids=["new", "accumulate"])
@pytest.mark.parametrize("m,n,k", [(7, 45, 63), (129, 100, 130), (1, 33, 384)])
def test_epilogue_matches_the_reference_and_every_path_agrees(ext, m, n, k, gelu, accumulate):
    x, w, b = testing.randn(m, k, scale=2.0), testing.randn(n, k, scale=0.1), testing.randn(n)
    old = testing.randn(m, n)
    packed = pack_int8(w)
    q, sx, zx = ext.int8_quantize_rows(x, True)
    wq, sw, colsum = unpack_int8_ref(packed, n, k)
    ref = int8_epilogue_ref(int8_matmul_ref(q[:m, :k], wq), sx, zx, sw, colsum, b, old if accumulate else None, gelu)
    outs = []
    for name, why in ext.int8_isas():
        if why:
            continue
        out = old.clone() if accumulate else testing.poison(torch.empty(m, n))
        got = ext.int8_gemm(q, sx, zx, packed, n, k, b, out, accumulate, gelu, name)
        assert got is out or got.data_ptr() == out.data_ptr()
        testing.assert_close(got, ref, name=f"{name} epilogue")
        outs.append((name, got))
    for name, got in outs[1:]:
        assert torch.equal(got, outs[0][1]), f"{name} differs from {outs[0][0]}"


def _cpu_flags() -> set[str]:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def test_dispatcher_picks_the_fastest_path_this_cpu_has(ext, monkeypatch):
    flags = _cpu_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo flags to compare with")
    avail = dict(ext.int8_isas())
    assert (avail["avx2"] is None) == ("avx2" in flags)
    assert (avail["avx512_vnni"] is None) == ({"avx512f", "avx512bw", "avx512_vnni"} <= flags)
    if not {"amx_tile", "amx_int8"} <= flags:
        assert avail["amx"] is not None and "AMX" in avail["amx"]
    want = "amx" if avail["amx"] is None else "avx512_vnni" if avail["avx512_vnni"] is None else "avx2"
    assert ext.int8_isa_best() == want
    monkeypatch.delenv(isa_mod.ENV, raising=False)
    assert isa_mod.chosen() == want
    monkeypatch.setenv(isa_mod.ENV, "avx2")
    assert isa_mod.chosen() == "avx2"
    monkeypatch.setenv(isa_mod.ENV, "sse9")
    with pytest.raises(ValueError, match="FASTENC_INT8_ISA must be one of"):
        isa_mod.isa()


def test_an_unavailable_or_unknown_path_is_refused_with_the_reason(ext):
    q, packed = torch.full((32, 64), 128, dtype=torch.uint8), pack_int8(testing.randn(4, 64))
    with pytest.raises(RuntimeError, match="isa must be one of"):
        ext.int8_gemm_raw(q, 1, packed, 4, 64, "neon")
    for name, why in ext.int8_isas():
        if why:
            with pytest.raises(RuntimeError, match="cannot run here"):
                ext.int8_gemm_raw(q, 1, packed, 4, 64, name)


def test_the_kernels_check_what_would_corrupt_memory(ext):
    packed = pack_int8(testing.randn(4, 64))
    with pytest.raises(RuntimeError, match="packed must be int8_pack's"):
        ext.int8_gemm_raw(torch.zeros(32, 64, dtype=torch.uint8), 1, packed[:-1], 4, 64, "")
    with pytest.raises(RuntimeError, match="q must be uint8"):  # fewer rows than the 32-row block AMX reads
        ext.int8_gemm_raw(torch.zeros(8, 64, dtype=torch.uint8), 8, packed, 4, 64, "")
    with pytest.raises(RuntimeError, match="q must be uint8"):  # k padded to 64
        ext.int8_gemm_raw(torch.zeros(32, 60, dtype=torch.uint8), 1, packed, 4, 64, "")
    with pytest.raises(RuntimeError, match="values must be in"):
        ext.int8_pack(torch.full((2, 3), -128, dtype=torch.int8), torch.ones(2))
    with pytest.raises(RuntimeError, match="k <= 65536"):
        ext.int8_gemm_raw(torch.zeros(32, 64, dtype=torch.uint8), 1, packed, 4, 70000, "")


def test_public_op_rejects_bad_input_naming_the_argument():
    w = testing.randn(5, 40)
    packed = pack_int8(w)
    x = testing.randn(3, 40)
    with pytest.raises(TypeError, match="x must be a float32"):
        ops.int8_linear(x.double(), packed, 5)
    with pytest.raises(ValueError, match="packed holds a weight of 5 output features, n is 6"):
        ops.int8_linear(x, packed, 6)
    with pytest.raises(ValueError, match="packed must be fastenc.quant.pack_int8's"):
        ops.int8_linear(x, packed, 40)
    with pytest.raises(ValueError, match="packed must be fastenc.quant.pack_int8's"):
        ops.int8_linear(testing.randn(3, 130), packed, 5)
    with pytest.raises(ValueError, match="n .* must be an int >= 1"):
        ops.int8_linear(x, packed, 0)
    with pytest.raises(ValueError, match="bias must have shape"):
        ops.int8_linear(x, packed, 5, testing.randn(4))
    with pytest.raises(ValueError, match="residual must have shape"):
        ops.int8_linear(x, packed, 5, residual=testing.randn(3, 4))
    with pytest.raises(ValueError, match="gelu must be None"):
        ops.int8_linear(x, packed, 5, gelu="erf")
    with pytest.raises(ValueError, match="pack_int8: weight holds NaN"):
        pack_int8(torch.full((2, 3), float("nan")))


def test_no_backward():
    w = testing.randn(5, 40)
    x = testing.randn(3, 40).requires_grad_()
    y = ops.int8_linear(x, pack_int8(w), 5, backend="reference")
    with pytest.raises(RuntimeError, match="int8_linear has no backward"):
        y.sum().backward()
