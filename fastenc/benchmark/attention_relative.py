"""`fastenc bench attention-relative`: attention with relative-position terms on the CPU (fp32, 2 threads unless
--threads): DeBERTa-v3's disentangled attention against transformers, the cost of the relative terms inside the
fused op, and the attention's working memory at 2,048 tokens. The workloads are built in attention_relative_cases.

Three targets, each timed in one process with its providers interleaved round by round (rotating order); a ratio
is the median (and 20% / 80% quantiles) of the per-round ratios:
  deberta  DeBERTa-v3-base attention forward + backward on the variable-length batch (16 sequences, lengths uniform
           in [16, 384], seed 0): fastenc (packed, cu_seqlens: relative-embedding LayerNorm, fused Wqkv GEMM, the
           c2p / p2c products, fastenc.ops.attention_qkv) against transformers' DisentangledSelfAttention on the
           batch padded to its longest (its relative-embedding LayerNorm included; its (batch, 1, seq, seq) mask and
           relative positions, built once per forward by its encoder, are made beforehand). Same weights; the
           outputs on real tokens are held to the tolerance rule and the gradients compared before timing.
           Ratio transformers time / fastenc time, target >= 3.
  bias     the fused op alone at 8 x 128 with the relative terms against the same op on the same q, k, v without
           them: MPNet's bucket bias (32 buckets, max distance 128, as fastenc/models/mpnet.py passes it) and
           DeBERTa's c2p + p2c (with positions, as the DeBERTa layer passes them), forward and forward + backward.
           Ratio relative time / plain time, target <= 1.15 for the distance-indexed bias (the MPNet rows: the
           target is the bias path's); the DeBERTa rows, whose terms are two gathers per score (and two scatters
           in the backward) rather than one lookup, are reported beside it.
  memory   one 2,048-token sequence through the attention forward (inference): extra peak resident memory of
           fastenc's step against transformers', in a fresh process (timing.peak_memory, every block >= 64 KiB
           mapped afresh). Ratio fastenc / transformers, target < 0.05.
Usage: fastenc bench attention-relative [--quick] [--parts deberta,bias,memory] [--threads 2] [--out DIR]
Writes DIR/attention-relative-fp32-t<threads>.json (machine, versions, commit, load) and .png.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from fastenc.benchmark import options, report, timing
from fastenc.benchmark.attention_relative_cases import (Sizes, bias_case, deberta_case, deberta_memory_case,
                                                        memory_parts)
from fastenc.benchmark.options import UsageError

COMMAND = "attention-relative"
HELP = ("attention with relative-position terms on the CPU: DeBERTa-v3 disentangled attention vs transformers "
        "(fwd+bwd), the bias path's cost vs plain attention at 8 x 128, and the working memory at 2,048 tokens")
PARTS = ("deberta", "bias", "memory")
BIAS_PATH = "bias-mpnet"  # the rows the bias target covers: the distance-indexed bias (DeBERTa's rows are reported)
TARGETS = {"deberta": (">=", 3.0), "bias": ("<=", 1.15), "memory": ("<", 0.05)}
THREADS = 2


def _paired(num: list[float], den: list[float]) -> dict:
    """Per-round ratios num / den: median and the 20% / 80% quantiles."""
    r = sorted(a / b for a, b in zip(num, den) if b > 0)
    return {"median": timing.percentile(r, 0.5), "q20": timing.percentile(r, 0.2),
            "q80": timing.percentile(r, 0.8), "rounds": len(r)}


def _met(part: str, value: float) -> bool:
    op, target = TARGETS[part]
    return {">=": value >= target, "<=": value <= target, "<": value < target}[op]


def _times(samples: dict[str, list[float]]) -> dict:
    return {k: timing.summarize(v).as_dict() for k, v in samples.items()}


def run_deberta(sizes: Sizes, repeats: int, min_time_s: float = 0.0) -> dict:
    """Target 1: the check, then fastenc and transformers fwd + bwd interleaved."""
    case = deberta_case(sizes)
    check = case.check()
    row = {"case": "deberta", "lengths": list(sizes.lengths), "tokens": case.tokens,
           "padded_tokens": case.padded_tokens, "rel_span": case.rel_span, "check": check}
    print(f"deberta check: output max err {check['out_max_err']:.2e} (tolerance {check['out_tolerance']:.2e}), "
          f"gradients max rel err {check['grad_max_rel_err']:.2e} ({check['grad_worst']}): "
          f"{'ok' if check['ok'] else 'FAILED'}", flush=True)
    samples = timing.interleaved({"fastenc": case.fastenc_step, "transformers": case.hf_step}, "cpu", warmup=1,
                                 repeats=repeats, min_time_s=min_time_s, max_repeats=2 * repeats)
    row["times_ms"] = _times(samples)
    row["transformers_over_fastenc"] = _paired(samples["transformers"], samples["fastenc"])
    return row


def run_bias(sizes: Sizes, repeats: int, min_time_s: float, max_repeats: int) -> list[dict]:
    """Target 2: per (terms, pass), the op with the relative terms and without, interleaved."""
    rows = []
    for terms in ("mpnet", "deberta"):
        for passes in ("forward", "forward+backward"):
            case = bias_case(sizes, terms, passes == "forward+backward")
            err = case.check()
            samples = timing.interleaved({"plain": case.plain, "relative": case.relative}, "cpu", warmup=2,
                                         repeats=repeats, min_time_s=min_time_s, max_repeats=max_repeats)
            row = {"case": f"bias-{terms}-{'fwd' if passes == 'forward' else 'fwd+bwd'}", "terms": terms,
                   "passes": passes, "batch": sizes.bias_batch, "seq": sizes.bias_seq, **case.info,
                   "check_max_err": err["max_err"], "check_tolerance": err["tolerance"], "check_ok": err["ok"],
                   "times_ms": _times(samples), "relative_over_plain": _paired(samples["relative"], samples["plain"])}
            rows.append(row)
            r = row["relative_over_plain"]
            print(f"{row['case']:>22}: plain {row['times_ms']['plain']['median_ms']:7.2f} ms | relative "
                  f"{row['times_ms']['relative']['median_ms']:7.2f} ms | relative/plain {r['median']:.3f} "
                  f"[{r['q20']:.3f}, {r['q80']:.3f}] (check vs reference {err['max_err']:.1e})", flush=True)
    return rows


def memory(sizes: Sizes) -> dict:
    """Target 3 in this process: extra peak memory of one forward of each side (timing.peak_memory)."""
    case = deberta_memory_case(sizes)
    with torch.inference_mode():
        case.fastenc_forward(), case.hf_forward()  # warm: extension loaded, threads started, weights packed
        fe, how = timing.peak_memory(case.fastenc_forward)
        hf, _ = timing.peak_memory(case.hf_forward)
    return {"tokens": sizes.memory_tokens, "fastenc_mib": fe, "transformers_mib": hf, "method": how,
            "fastenc_over_transformers": fe / hf if hf > 0 else float("nan"), **memory_parts(case)}


def memory_subprocess(sizes: Sizes, threads: int) -> dict:
    """`memory` in a fresh process whose allocator maps every block >= 64 KiB afresh (glibc's
    MALLOC_MMAP_THRESHOLD_), so the resident-set peak shows each call's own allocations, not reused heap."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    cmd = [sys.executable, "-m", "fastenc.benchmark.attention_relative", "--memory-only",
           "--sizes", json.dumps(sizes.as_dict()), "--threads", str(threads)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"attention-relative memory process failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def targets(result: dict) -> dict:
    """{part: {target, op, median, q20, q80, met}} from the parts that ran; prints one line per target."""
    out = {}
    if "deberta" in result:
        r = result["deberta"]["transformers_over_fastenc"]
        r0 = result["deberta"]
        out["deberta"] = {"what": f"transformers time / fastenc time, DeBERTa attention fwd+bwd, {len(r0['lengths'])} "
                                  f"sequences, {r0['tokens']} tokens ({r0['padded_tokens']} padded)", **r}
    if "bias" in result:
        biased = [row for row in result["bias"] if row["case"].startswith(BIAS_PATH)]
        worst = max(biased, key=lambda row: row["relative_over_plain"]["median"])
        out["bias"] = {"what": f"relative / plain time of the fused op at {worst['batch']} x {worst['seq']}, worst "
                               f"distance-bias row ({worst['case']})",
                       **worst["relative_over_plain"],
                       "rows": {row["case"]: row["relative_over_plain"]["median"] for row in result["bias"]}}
    if "memory" in result:
        m = result["memory"]
        v = m["fastenc_over_transformers"]
        out["memory"] = {"what": f"fastenc / transformers extra peak memory, attention forward, one "
                                 f"{m['tokens']}-token sequence", "median": v, "q20": v, "q80": v}
    for part, t in out.items():
        op, target = TARGETS[part]
        t.update(target=target, op=op, met=_met(part, t["median"]))
        spread = f" [{t['q20']:.3f}, {t['q80']:.3f}]" if part != "memory" else ""
        print(f"target {part}: {t['what']}: {t['median']:.3f}{spread}, needs {op} {target}: "
              f"{'met' if t['met'] else 'NOT met'}", flush=True)
    return out


def run(out: Path, sizes: Sizes = Sizes(), parts=PARTS, quick: bool = False, repeats: int | None = None,
        fresh_process: bool = True, plots: bool = True, note: str | None = None) -> dict:
    """Run `parts` of the benchmark at `sizes`, print a summary line per target, write the JSON (and PNG)."""
    threads = torch.get_num_threads()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"attention-relative: CPU fp32, {threads} threads, hidden {sizes.hidden}, heads {sizes.heads}; load average "
          f"{load if load is None else round(load, 1)} (other work skews both sides of each pair alike: rounds are "
          "interleaved)", flush=True)
    result: dict = {}
    failures = []
    if "deberta" in parts:
        result["deberta"] = run_deberta(sizes, repeats or (3 if quick else 7), 0.0 if quick else 5.0)
        if not result["deberta"]["check"]["ok"]:
            failures.append("deberta: fastenc and transformers disagree (see check)")
    if "bias" in parts:
        result["bias"] = run_bias(sizes, repeats or (5 if quick else 15), 0.3 if quick else 2.0,
                                  40 if quick else 300)
        failures += [f"{r['case']}: relative op disagrees with the reference" for r in result["bias"]
                     if not r["check_ok"]]
    if "memory" in parts:
        m = memory_subprocess(sizes, threads) if fresh_process else memory(sizes)
        print(f"memory, {m['tokens']} tokens: fastenc {m['fastenc_mib']:.1f} MiB | transformers "
              f"{m['transformers_mib']:.1f} MiB (one score matrix {m['score_matrix_mib']:.0f} MiB; fastenc's c2p + "
              f"p2c {m['c2p_p2c_mib']:.0f} MiB for {m['heads_per_call']} heads at a time, qkv {m['qkv_mib']:.0f} MiB)",
              flush=True)
        result["memory"] = m
    verdict = targets(result)
    stem = f"attention-relative-fp32-t{threads}"
    payload = {**report.metadata("cpu", torch.float32, quick), "benchmark": COMMAND, "note": note,
               "load_average_1min": load, "sizes": sizes.as_dict(), **result, "targets": verdict}
    files = [report.write_json(Path(out) / f"{stem}.json", payload)]
    if plots and verdict:
        png = plot(result, verdict, Path(out) / f"{stem}.png", f"relative attention, CPU fp32, {threads} threads")
        if png is not None:
            files.append(png)
    return {"files": files, "failures": failures, "result": payload}


def plot(result: dict, verdict: dict, path: Path, title: str) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    panels = [p for p in PARTS if p in verdict]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.4), squeeze=False)
    for ax, part in zip(axes[0], panels):
        if part == "bias":
            names = [r["case"][5:] for r in result["bias"]]
            vals = [[r["relative_over_plain"][q] for r in result["bias"]] for q in ("q20", "median", "q80")]
        else:
            names = [part]
            t = verdict[part]
            vals = [[t["q20"]], [t["median"]], [t["q80"]]]
        lo, mid, hi = vals
        ax.bar(range(len(names)), mid, 0.6, yerr=[[m - a for m, a in zip(mid, lo)], [b - m for m, b in zip(mid, hi)]])
        ax.axhline(TARGETS[part][1], color="r", lw=0.8, ls="--", label=f"target {TARGETS[part][0]} {TARGETS[part][1]}")
        ax.set_xticks(range(len(names)), names, fontsize=7, rotation=20)
        ax.set_title({"deberta": "transformers / fastenc time", "bias": "relative / plain time",
                      "memory": "fastenc / transformers memory"}[part], fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def add_arguments(p) -> None:
    options.no_plots(p)
    p.add_argument("--parts", default=None, help=f"comma-separated of {', '.join(PARTS)} (default: all)")


def command(a, device: str, dtype, out: Path) -> dict:
    if device != "cpu" or dtype != torch.float32:
        raise UsageError(f"bench attention-relative: CPU fp32 only, got --device {device} --dtype "
                         f"{str(dtype).replace('torch.', '')}")
    parts = options.split(a.parts) or list(PARTS)
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise UsageError(f"bench attention-relative: unknown part(s) {bad}; choose from {list(PARTS)}")
    if a.threads is None:
        torch.set_num_threads(THREADS)
    res = run(out, parts=parts, quick=a.quick, repeats=a.repeats, plots=not a.no_plots, note=a.note)
    return {"files": res["files"], "failures": res["failures"]}


def main(argv=None) -> int:
    """The memory process: `--memory-only --sizes JSON [--threads N]` prints its result as one JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--memory-only", action="store_true", required=True)
    p.add_argument("--sizes", default="{}")
    p.add_argument("--threads", type=int, default=THREADS)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    print(json.dumps(memory(Sizes.from_dict(json.loads(a.sizes)))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
