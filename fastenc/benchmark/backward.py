"""Training benchmarks (`fastenc bench kernels --backward`): forward + backward of every op through fastenc (the
backend automatic selection picks on the device) beside torch eager autograd of the same math and torch.compile of
that math, and for attention torch SDPA on the padded batch, timed interleaved in one process.

Each row carries the op's forward + backward bytes (elementwise ops and norms: their floor is moving them once at
the copy bandwidth measured in the same run) or FLOPs (attention, lora_linear: the fraction of the measured GEMM
rate), the paired ratios baseline / fastenc per round (median and the 20-80% spread), and the largest gradient
difference between fastenc and eager autograd relative to the gradient's size.

Minimum bytes of fwd + bwd (element size e; weights, tables and statistics ignored):
  layer_norm / rms_norm + residual  fwd read x, r, write y, h; bwd read dy, dh, h, write dx     8 * rows * n * e
  gelu + bias                       fwd read x, write y; bwd read dy, x, write dx               5 * rows * n * e
  geglu (2n -> n)                   fwd read 2n, write n; bwd read dy (n), x (2n), write 2n     8 * rows * n * e
  rope of q and k                   fwd read q, k, write both; bwd read both grads, write both  8 * tokens*heads*d*e
FLOPs: attention 4 s^2 d per head per sequence forward, 10 s^2 d backward (S, dP, dV, dK, dQ) = 3.5x the forward;
lora_linear x W^T + s (x A^T) B^T with W frozen: forward 2 t (i o + r (i + o)); backward dx 2 t (i o + r (i + o)),
dA and dB 2 t r (i + o): 4 t i o + 6 t r (i + o) in all.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

import fastenc
from fastenc import registry
from fastenc.benchmark import ceilings, report, timing
from fastenc.benchmark.kernels import HEAD_DIM, HEADS, HIDDEN, UsageError, varlen_lengths
from fastenc.reference.rope import rope_cache

TARGETS = {"attention": ("sdpa", 2.0)}  # attention: >= 2x SDPA; the others: >= eager, within 10% of compile


@dataclass
class BwdCase:
    op: str
    shape: str
    rows: int
    dims: dict = field(default_factory=dict)
    lengths: list[int] = field(default_factory=list)


def backward_cases(quick: bool = False) -> list[BwdCase]:
    """BERT-base / ModernBERT-base training shapes (8 x 128 tokens; attention: the varlen workload, 16 sequences
    with lengths in [16, 384], seed 0); quick: a few tokens, for a smoke run."""
    rows = 64 if quick else 8 * 128
    lens = [5, 17, 9] if quick else varlen_lengths()
    h = 64 if quick else HIDDEN
    heads, d = (2, 16) if quick else (HEADS, HEAD_DIM)
    return [
        BwdCase("attention", f"varlen {len(lens)}x[{min(lens)},{max(lens)}] h{heads} d{d}", sum(lens),
                {"heads": heads, "d": d}, lens),
        BwdCase("layer_norm", f"{rows} x h{h} +res", rows, {"n": h}),
        BwdCase("rms_norm", f"{rows} x h{h} +res", rows, {"n": h}),
        BwdCase("gelu", f"{rows} x n{4 * h} +bias", rows, {"n": 4 * h}),
        BwdCase("geglu", f"{rows} x 2x{3 * h // 2}", rows, {"n": 3 * h // 2}),
        BwdCase("rope", f"{rows} x h{heads} d{d}, 128-token sequences", rows, {"heads": heads, "d": d}),
        BwdCase("lora_linear", f"{rows} x {h}->{3 * h} r{8 if quick else 16}", rows,
                {"in": h, "out": 3 * h, "r": 8 if quick else 16}),
    ]


@dataclass
class _Bench:
    fastenc: Callable[[], object]
    eager: Callable[..., object]  # the same math in plain torch, over `args`
    args: tuple
    leaves: list[torch.Tensor]   # fastenc's inputs that get gradients
    eager_leaves: list[torch.Tensor]
    grads: list[torch.Tensor]
    nbytes: int = 0
    flops: float = 0.0
    unpad: Callable[[torch.Tensor], torch.Tensor] | None = None  # padded (b, h, s, d) grad -> packed (t, h, d)


def _setup(case: BwdCase, device: str, dtype: torch.dtype) -> _Bench:
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape, scale=1.0, grad=False):
        t = (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)
        return t.requires_grad_(grad)

    def twin(ts):
        return [t.detach().clone().requires_grad_(t.requires_grad) for t in ts]

    e, rows, op = torch.tensor([], dtype=dtype).element_size(), case.rows, case.op
    if op in ("layer_norm", "rms_norm"):
        n = case.dims["n"]
        x, r, w, b = rnd(rows, n, grad=True), rnd(rows, n, grad=True), rnd(n, grad=True), rnd(n, scale=0.1, grad=True)
        grads = [rnd(rows, n), rnd(rows, n)]
        if op == "layer_norm":
            ours = (lambda: fastenc.ops.layer_norm(x, w, b, residual=r))
            eager = (lambda x, r, w, b: (F.layer_norm(x + r, (n,), w, b, 1e-5), x + r))
            inputs = [x, r, w, b]
        else:
            ours = (lambda: fastenc.ops.rms_norm(x, w, residual=r))
            eager = (lambda x, r, w: (F.rms_norm(x + r, (n,), w, 1e-6), x + r))
            inputs = [x, r, w]
        twins = twin(inputs)
        return _Bench(ours, eager, tuple(twins), inputs, twins, grads, nbytes=8 * rows * n * e)
    if op == "gelu":
        n = case.dims["n"]
        x, b = rnd(rows, n, grad=True), rnd(n, scale=0.1, grad=True)
        twins = twin([x, b])
        return _Bench(lambda: fastenc.ops.gelu(x, b), lambda x, b: F.gelu(x + b), tuple(twins), [x, b], twins,
                      [rnd(rows, n)], nbytes=5 * rows * n * e)
    if op == "geglu":
        n = case.dims["n"]
        x = rnd(rows, 2 * n, grad=True)
        twins = twin([x])

        def geglu(x):
            a, gate = x.chunk(2, dim=-1)
            return F.gelu(a) * gate
        return _Bench(lambda: fastenc.ops.geglu(x), geglu, tuple(twins), [x], twins, [rnd(rows, n)],
                      nbytes=8 * rows * n * e)
    if op == "rope":
        heads, d = case.dims["heads"], case.dims["d"]
        q, k = rnd(rows, heads, d, grad=True), rnd(rows, heads, d, grad=True)
        cos, sin = (t.to(device) for t in rope_cache(d, 512))
        seq = 128 if rows % 128 == 0 else rows
        cu = torch.arange(0, rows + 1, seq, dtype=torch.int32, device=device)
        pos = torch.arange(rows, device=device) % seq
        c, s = cos[pos][:, None, :].to(dtype), sin[pos][:, None, :].to(dtype)
        twins = twin([q, k])

        def rope(q, k, c, s):
            def rot(t):
                x1, x2 = t[..., :d // 2], t[..., d // 2:]
                return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
            return rot(q), rot(k)
        return _Bench(lambda: fastenc.ops.rope(q, k, cos, sin, cu_seqlens=cu), rope, (*twins, c, s), [q, k], twins,
                      [rnd(rows, heads, d), rnd(rows, heads, d)], nbytes=8 * rows * heads * d * e)
    if op == "lora_linear":
        i, o, r = case.dims["in"], case.dims["out"], case.dims["r"]
        x, w, bias = rnd(rows, i, grad=True), rnd(o, i, scale=i ** -0.5), rnd(o, scale=0.1)
        a, b = rnd(r, i, scale=i ** -0.5, grad=True), rnd(o, r, scale=0.1, grad=True)
        twins = twin([x, a, b])

        def lora(x, a, b):
            return F.linear(x, w, bias) + 2.0 * F.linear(F.linear(x, a), b)
        return _Bench(lambda: fastenc.ops.lora_linear(x, w, bias, a, b, 2.0), lora, tuple(twins), [x, a, b], twins,
                      [rnd(rows, o)], flops=4.0 * rows * i * o + 6.0 * rows * r * (i + o))
    if op == "attention":
        heads, d, lens = case.dims["heads"], case.dims["d"], case.lengths
        total, longest, nb = sum(lens), max(lens), len(lens)
        q, k, v = (rnd(total, heads, d, grad=True) for _ in range(3))
        g = rnd(total, heads, d)
        cu = torch.zeros(nb + 1, dtype=torch.int32, device=device)
        cu[1:] = torch.tensor(lens, device=device).cumsum(0)
        mask = torch.arange(longest, device=device)[None, :] < torch.tensor(lens, device=device)[:, None]

        def pad(t):
            out = t.new_zeros(nb, longest, heads, d)
            out[mask] = t
            return out.transpose(1, 2).contiguous()  # (b, h, s, d)
        padded = [pad(t.detach()).requires_grad_(True) for t in (q, k, v)]
        attn_mask = mask[:, None, None, :]

        def sdpa(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        fwd = sum(4.0 * s * s * d for s in lens) * heads
        return _Bench(lambda: fastenc.ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=longest), sdpa,
                      tuple(padded), [q, k, v], padded, [pad(g)], flops=3.5 * fwd,
                      unpad=lambda t: t.transpose(1, 2)[mask])
    raise UsageError(f"no backward benchmark for op {op!r}")


def _step(fn: Callable[[], object], leaves: list[torch.Tensor], grads: list[torch.Tensor]) -> Callable[[], None]:
    def call():
        for t in leaves:
            t.grad = None
        out = fn()
        outs = list(out) if isinstance(out, tuple) else [out]
        torch.autograd.backward(outs, grads)
    return call


def _grad_error(bench: _Bench, run_eager: Callable[[], None], fastenc_grads: list[torch.Tensor]) -> float:
    """max |fastenc grad - eager grad| / max |eager grad| over the inputs that get gradients."""
    _step(bench.fastenc, bench.leaves, fastenc_grads)()
    run_eager()
    worst = 0.0
    for ours, theirs in zip(bench.leaves, bench.eager_leaves):
        ref = theirs.grad if bench.unpad is None else bench.unpad(theirs.grad)
        scale = float(ref.abs().max()) or 1.0
        worst = max(worst, float((ours.grad.float() - ref.float()).abs().max()) / scale)
    return worst


def _paired(samples: dict[str, list[float]], base: str, ours: str = "fastenc") -> dict:
    """Per-round ratios base / ours (> 1: fastenc faster): median and the 20% / 80% quantiles."""
    ratios = [b / o for b, o in zip(samples[base], samples[ours]) if o > 0]
    return {"median": timing.percentile(ratios, 0.5), "q20": timing.percentile(ratios, 0.2),
            "q80": timing.percentile(ratios, 0.8), "rounds": len(ratios)}


def run_case(case: BwdCase, device: str, dtype: torch.dtype, ceil: dict, *, repeats: int = 7,
             compile_ref: bool = True, min_time_s: float = 1.0) -> dict:
    """Time fastenc, eager autograd, torch.compile and (attention) SDPA fwd + bwd; one result row."""
    bench = _setup(case, device, dtype)
    fastenc_grads = bench.grads if bench.unpad is None else [bench.unpad(bench.grads[0]).contiguous()]
    providers = {"fastenc": _step(bench.fastenc, bench.leaves, fastenc_grads)}
    base = "sdpa" if case.op == "attention" else "torch-eager"
    providers[base] = _step(lambda: bench.eager(*bench.args), bench.eager_leaves, bench.grads)
    row = {"op": case.op, "shape": case.shape, "device": device, "dtype": str(dtype).replace("torch.", ""),
           "backend": _backend(case.op, bench), "grad_rel_err": _grad_error(bench, providers[base], fastenc_grads)}
    if compile_ref:
        compiled = torch.compile(bench.eager)
        providers["torch-compile"] = _step(lambda: compiled(*bench.args), bench.eager_leaves, bench.grads)
        print(f"  compiling the {case.op} baseline ...", file=sys.stderr, flush=True)
        providers["torch-compile"]()
    samples = timing.interleaved(providers, device, warmup=2, repeats=repeats, min_time_s=min_time_s,
                                 max_repeats=4 * repeats)
    for name, v in samples.items():
        st = timing.summarize(v)
        row[f"{name}_ms"], row[f"{name}_min_ms"] = st.median_ms, st.min_ms
    for name in samples:
        if name != "fastenc":
            row[f"{name}_over_fastenc"] = _paired(samples, name)
    ms = row["fastenc_ms"]
    if bench.nbytes:
        gbs = ceil["copy_bandwidth"]["value"]
        row.update(bytes=bench.nbytes, gb_per_s=bench.nbytes / (ms / 1e3) / 1e9,
                   floor_ms=bench.nbytes / (gbs * 1e9) * 1e3)
        row["fraction_of_copy_bandwidth"] = row["floor_ms"] / ms
    if bench.flops:
        rate = ceil["gemm_rate"]["value"]
        row.update(flops=bench.flops, tflops=bench.flops / (ms / 1e3) / 1e12)
        row["fraction_of_gemm_rate"] = row["tflops"] / rate
    target = TARGETS.get(case.op)
    if target is not None:
        row["target"] = f">= {target[1]}x {target[0]}"
    else:
        row["target"] = ">= torch-eager, within 10% of torch-compile"
    return row


def _backend(op: str, bench: _Bench) -> str:
    """The backend automatic selection picks for this case's forward (asked the same way the op asks)."""
    x = bench.leaves[0]
    inputs = {"q": x} if op == "attention" else {"x": x, "lora_a": bench.leaves[1]} if op == "lora_linear" else {"x": x}
    try:
        return registry.select(op, inputs).backend
    except ValueError as e:
        return f"? ({e})"


def bench_backward(device: str, dtype: torch.dtype, *, quick: bool, out: Path, ops=None, compile_ref: bool = True,
                   note: str | None = None) -> dict:
    """Run every backward case (or `ops`), print a table, write backward.json into `out`."""
    cases = backward_cases(quick)
    if ops:
        unknown = sorted(set(ops) - {c.op for c in cases})
        if unknown:
            raise UsageError(f"--ops: no backward benchmark for {unknown}; known: {sorted({c.op for c in cases})}")
        cases = [c for c in cases if c.op in ops]
    meta = report.metadata(device, dtype, quick)
    ceil = ceilings.measure(device, dtype, quick)
    rows = []
    for i, case in enumerate(cases):
        print(f"[{i + 1}/{len(cases)}] {case.op} {case.shape}", file=sys.stderr, flush=True)
        rows.append(run_case(case, device, dtype, ceil, repeats=3 if quick else 9, compile_ref=compile_ref,
                             min_time_s=0.0 if quick else 1.0))
    print(table(rows))
    out.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "note": note, "ceilings": ceil, "rows": rows}
    path = report.write_json(out / "backward.json", payload)
    return {"rows": rows, "files": [path], "failures": []}


def table(rows: list[dict]) -> str:
    flat = []
    for r in rows:
        f = {k: v for k, v in r.items() if not isinstance(v, dict)}
        for k, v in r.items():
            if isinstance(v, dict):
                f[k] = f"{v['median']:.2f} [{v['q20']:.2f}, {v['q80']:.2f}]"
        flat.append(f)
    cols = [("op", "op"), ("backend", "backend"), ("fastenc_ms", "fastenc ms"), ("torch-eager_over_fastenc", "eager/ours"),
            ("sdpa_over_fastenc", "sdpa/ours"), ("torch-compile_over_fastenc", "compile/ours"),
            ("fraction_of_copy_bandwidth", "of copy bw"), ("fraction_of_gemm_rate", "of GEMM"),
            ("grad_rel_err", "grad err")]
    return report.table(flat, [c for c in cols if any(c[0] in r for r in flat)])
