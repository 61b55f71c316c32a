"""Training cost of GELU(+bias), GeGLU and RoPE on the CPU: forward + backward of fastenc's cpu backend against
torch eager autograd of the same math and torch.compile (inductor) of it, side by side in one process.

Shapes (BERT-base / ModernBERT-base): gelu+bias on (4096, 3072); geglu (4096, 2304) -> (4096, 1152); rope of q and
k (4096 tokens, 12 heads, 64). fp32, 2 threads by default. Timed interleaved (A B C A B C ...), medians and minimums.

The floor: an elementwise forward + backward must move at least these bytes (fp32, tables and the bias ignored):
  gelu  fwd read x, write y; bwd read grad and x, write dx                       -> 5 * rows * n * 4
  geglu fwd read x (2n), write y (n); bwd read grad (n) and x (2n), write dx (2n) -> 8 * rows * n * 4
  rope  fwd read q, k, write both; bwd read both gradients, write both            -> 8 * tokens * heads * dim * 4
and the machine's copy bandwidth (read + write bytes per second of a 256 MiB tensor copy) is measured in the same
run, so `floor_ms` = bytes / bandwidth and `of_floor` = floor_ms / fastenc_ms.
Usage: python bench/act_rope_backward.py [--threads 2] [--repeats 15] [--no-compile]
Writes bench/out/act_rope_backward-cpu-fp32-t<threads>.json.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    import torch
    import torch.nn.functional as F

    import fastenc
    from fastenc.benchmark import report, timing
    from fastenc.reference import rope_cache

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g)

    rows = 256 if args.quick else 4096

    # ---- the same math in plain torch (what eager autograd and torch.compile differentiate)
    def gelu_eager(x, b):
        return F.gelu(x + b)

    def geglu_eager(x):
        a, gate = x.chunk(2, dim=-1)
        return F.gelu(a) * gate

    def rope_eager(q, k, c, s):
        def rot(t):
            x1, x2 = t[..., :32], t[..., 32:]
            return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
        return rot(q), rot(k)

    cos, sin = rope_cache(64, 8192, 160000.0)
    pos = torch.arange(rows) % 512
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    cu = torch.tensor([0] + [min(rows, i) for i in range(512, rows + 1, 512)], dtype=torch.int32)
    if int(cu[-1]) != rows:
        cu = torch.cat([cu, torch.tensor([rows], dtype=torch.int32)])

    cases = []
    x, b, gy = rnd(rows, 3072).requires_grad_(), rnd(3072).requires_grad_(), rnd(rows, 3072)
    cases.append(("gelu+bias", 5 * rows * 3072 * 4, {
        "fastenc": lambda: fastenc.ops.gelu(x, b, backend="cpu"),
        "eager": lambda: gelu_eager(x, b),
    }, gelu_eager, (x, b), [gy], f"({rows}, 3072)"))
    xg, gg = rnd(rows, 2304).requires_grad_(), rnd(rows, 1152)
    cases.append(("geglu", 8 * rows * 1152 * 4, {
        "fastenc": lambda: fastenc.ops.geglu(xg, backend="cpu"),
        "eager": lambda: geglu_eager(xg),
    }, geglu_eager, (xg,), [gg], f"({rows}, 2304) -> ({rows}, 1152)"))
    q, k = rnd(rows, 12, 64).requires_grad_(), rnd(rows, 12, 64).requires_grad_()
    gq, gk = rnd(rows, 12, 64), rnd(rows, 12, 64)
    cases.append(("rope", 8 * rows * 12 * 64 * 4, {
        "fastenc": lambda: fastenc.ops.rope(q, k, cos, sin, cu_seqlens=cu, backend="cpu"),
        "eager": lambda: rope_eager(q, k, c, s),
    }, rope_eager, (q, k, c, s), [gq, gk], f"q, k ({rows}, 12, 64), packed, 512-token sequences"))

    # ---- copy bandwidth of this machine, now
    src = torch.randn(64 * 2**20)
    dst = torch.empty_like(src)
    copy = timing.time_fn(lambda: dst.copy_(src), "cpu", warmup=2, repeats=20)
    bw = 2 * src.numel() * 4 / (copy.min_ms / 1e3)  # bytes read + written per second, best run
    del src, dst

    results = []
    for name, nbytes, fns, eager_fn, inputs, grads, shape in cases:
        leaves = [t for t in inputs if t.requires_grad]

        def step(f, grads=grads, leaves=leaves):
            for t in leaves:
                t.grad = None
            out = f()
            outs = list(out) if isinstance(out, tuple) else [out]
            torch.autograd.backward(outs, grads)

        providers = {p: (lambda f=f: step(f)) for p, f in fns.items()}
        if not args.no_compile:
            compiled = torch.compile(eager_fn)
            providers["compile"] = lambda f=compiled, a=inputs: step(lambda: f(*a))
            print(f"compiling {name} ...", file=sys.stderr, flush=True)
            providers["compile"]()
        samples = timing.interleaved(providers, "cpu", warmup=2, repeats=args.repeats)
        stats = {p: timing.summarize(v) for p, v in samples.items()}
        floor_ms = nbytes / bw * 1e3
        row = {"op": name, "shape": shape, "bytes": nbytes, "floor_ms": floor_ms}
        for p, st in stats.items():
            row[f"{p}_ms"] = st.median_ms
            row[f"{p}_min_ms"] = st.min_ms
        f = stats["fastenc"]
        row["eager_over_fastenc"] = stats["eager"].median_ms / f.median_ms
        if "compile" in stats:
            row["compile_over_fastenc"] = stats["compile"].median_ms / f.median_ms
            row["compile_over_fastenc_min"] = stats["compile"].min_ms / f.min_ms
        row["of_floor"] = floor_ms / f.median_ms
        row["of_floor_min"] = floor_ms / f.min_ms
        results.append(row)

    cols = [("op", "op"), ("fastenc_ms", "fastenc ms"), ("eager_ms", "eager ms"), ("compile_ms", "compile ms"),
            ("eager_over_fastenc", "eager/fastenc"), ("compile_over_fastenc", "compile/fastenc"),
            ("floor_ms", "floor ms"), ("of_floor", "floor/fastenc")]
    print(f"copy bandwidth {bw / 1e9:.2f} GB/s (read + write), {args.threads} threads, fp32, fwd+bwd")
    print(report.table(results, [c for c in cols if any(c[0] in r for r in results)]))
    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    payload = {"machine": report.metadata("cpu", torch.float32, args.quick), "threads": args.threads,
               "copy_bandwidth_gbs": bw / 1e9, "rows": results}
    path = report.write_json(out / f"act_rope_backward-cpu-fp32-t{args.threads}.json", payload)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
