"""Packed vs plain CPU GEMM per shape: the measurement behind fastenc.layers.prepack.min_rows (MIN_TOKENS,
MIN_TOKENS_SMALL, LARGE_WEIGHT) and use_panels.

For each model linear shape (K in, N out) and token count M, times y = x @ W.T + b three ways, interleaved round
by round in one process: `plain` (torch.addmm into a preallocated output, fastenc's unpacked path), `packed`
(oneDNN on the weight packed once, fastenc.layers.prepack.linear), and the residual form out += x @ W.T:
`plain-acc` (addmm_ with beta 1) vs `packed-acc` (oneDNN's binary add post-op into a new tensor); and fastenc's
GEMM on its own panels (`panels`, `panels-acc`: prepack.panel_gemm, the rule prepack.use_panels). Reports medians,
the paired ratios plain/packed (median over rounds; > 1: packing wins) and best-of(plain, packed)/panels (> 1: the
panels win) with their 20-80% spread, GFLOP/s, and the max relative difference packed vs plain. With --threads 1
the samples are the calling thread's CPU time (time.thread_time: little moved by other load on the machine), else
wall time. With --layers L each case has L distinct weights and the calls
of a sample cycle through them, so a weight comes from memory as in a forward over L layers (BERT-base's 12 layers
hold 340 MB) rather than from the cache as one weight called again and again does (L = 1, the default).

  python -m fastenc.benchmark.gemm_pack [--out DIR] [--threads 2] [--tokens 1,16,128] [--rounds 9] [--shapes minilm,bert out]
      [--layers 12]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from fastenc.benchmark import report, timing
from fastenc.layers import prepack

# (name, K, N): the linears of BERT-base (hidden 768, intermediate 3072) and MiniLM-L6 (384, 1536)
SHAPES = (("bert qkv", 768, 2304), ("bert out", 768, 768), ("bert fc1", 768, 3072), ("bert fc2", 3072, 768),
          ("minilm qkv-part", 384, 384), ("minilm fc1", 384, 1536), ("minilm fc2", 1536, 384))
TOKENS = (1, 4, 8, 16, 32, 128, 512, 2048)


def measure(k: int, n: int, m: int, rounds: int, seed: int = 0, layers: int = 1) -> dict:
    """One (M, K, N) case: medians (ms), paired ratios with their 20/80% quantiles, GFLOP/s, max rel diff.
    layers: distinct weights the calls of a sample cycle through (module docstring)."""
    if layers < 1:
        raise ValueError(f"gemm_pack: layers must be >= 1, got {layers}")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    ws = [torch.randn(n, k, generator=g) / k ** 0.5 for _ in range(layers)]
    w, b = ws[0], torch.randn(n, generator=g)
    packs = [prepack.PackCache().get(w_)[0] for w_ in ws]
    out = torch.empty(m, n)
    acc = torch.randn(m, n, generator=g)
    ref = torch.addmm(b, x, w.t())
    got = prepack.linear(x, packs[0], b)
    rel = float((got - ref).abs().max() / ref.abs().max())
    fns = {"plain": lambda i: torch.addmm(b, x, ws[i].t(), out=out),
           "packed": lambda i: prepack.linear(x, packs[i], b),
           "plain-acc": lambda i: acc.addmm_(x, ws[i].t()),
           "packed-acc": lambda i: torch.ops.mkldnn._linear_pointwise.binary(x, acc, packs[i], None, "add")}
    panels = [prepack.PackCache(panels=True).get(w_)[0] for w_ in ws]  # (builds the extension if needed)
    fns["panels"] = lambda i: prepack.panel_gemm(x, panels[i], n, b, out)
    fns["panels-acc"] = lambda i: prepack.panel_gemm(x, panels[i], n, None, acc, accumulate=True)
    reps = max(1, min(50, int(2e8 / (2 * m * k * n))))  # calls per sample: ~0.2 GFLOP a sample, a few ms
    reps = -(-reps // layers) * layers  # a whole number of passes over the weights

    def batched(fn):
        def run():
            for i in range(reps):
                fn(i % layers)
        return run

    clock = time.thread_time if torch.get_num_threads() == 1 else None
    samples = timing.interleaved({name: batched(fn) for name, fn in fns.items()}, "cpu", warmup=1, repeats=rounds,
                                 clock=clock)
    samples = {name: [t / reps for t in s] for name, s in samples.items()}
    row = {"M": m, "K": k, "N": n, "layers": layers, "calls_per_sample": reps, "max_rel_diff": rel}
    for name, s in samples.items():
        med = statistics.median(s)
        row[f"{name}_ms"] = med
        row[f"{name}_gflops"] = 2 * m * k * n / (med * 1e6)
    for a, p in (("plain", "packed"), ("plain-acc", "packed-acc")):
        ratios = sorted(x / y for x, y in zip(samples[a], samples[p]))
        row[f"{a}/{p}"] = statistics.median(ratios)
        row[f"{a}/{p} q20-q80"] = [timing.percentile(ratios, 0.2), timing.percentile(ratios, 0.8)]
    best = [min(a, p) for a, p in zip(samples["plain"], samples["packed"])]
    ratios = sorted(x / y for x, y in zip(best, samples["panels"]))
    row["best/panels"] = statistics.median(ratios)
    row["best/panels q20-q80"] = [timing.percentile(ratios, 0.2), timing.percentile(ratios, 0.8)]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="folder for gemm_pack.json (default: print only)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--shapes", default=None, help="comma-separated substrings of shape names to keep (default: all)")
    p.add_argument("--layers", type=int, default=1,
                   help="distinct weights per case the calls cycle through (12: BERT-base's forward; default 1)")
    a = p.parse_args(argv)
    keep = [k.strip() for k in a.shapes.split(",")] if a.shapes else None
    if a.threads:
        torch.set_num_threads(a.threads)
    rows = []
    t0 = time.perf_counter()
    with torch.no_grad():  # (weights made under inference_mode would be inference tensors, never packed)
        for name, k, n in SHAPES:
            if keep is not None and not any(k_ in name for k_ in keep):
                continue
            for m in (int(t) for t in a.tokens.split(",")):
                r = {"shape": name, **measure(k, n, m, a.rounds, layers=a.layers)}
                rows.append(r)
                print(f"{name:16s} M={m:5d} K={k:5d} N={n:5d}  plain {r['plain_gflops']:6.1f} GF/s  packed "
                      f"{r['packed_gflops']:6.1f} GF/s  plain/packed {r['plain/packed']:.2f} "
                      f"[{r['plain/packed q20-q80'][0]:.2f}, {r['plain/packed q20-q80'][1]:.2f}]  acc "
                      f"{r['plain-acc/packed-acc']:.2f}  rel diff {r['max_rel_diff']:.1e}"
                      f"  panels {r['panels_gflops']:6.1f} GF/s  best/panels {r['best/panels']:.2f} "
                      f"[{r['best/panels q20-q80'][0]:.2f}, {r['best/panels q20-q80'][1]:.2f}]", flush=True)
    if a.out:
        meta = report.metadata("cpu", torch.float32, False)
        meta.update(threads=torch.get_num_threads(), min_tokens=prepack.MIN_TOKENS,
                    min_tokens_small=prepack.MIN_TOKENS_SMALL, large_weight=prepack.LARGE_WEIGHT,
                    rounds=a.rounds, layers=a.layers,
                    elapsed_s=time.perf_counter() - t0, load_after=_load())
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gemm_pack.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
        print(f"wrote {out / 'gemm_pack.json'}")
    return 0


def _load() -> list[float] | None:
    try:
        import os
        return list(os.getloadavg())
    except OSError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
