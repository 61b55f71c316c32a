"""Where a model's time goes in `fastenc bench models --breakdown`: fastenc's and transformers sdpa's calls under
torch.profiler per workload, with fastenc's GEMM floor (its GEMMs timed alone) for the throughput ones."""
from __future__ import annotations

from fastenc.benchmark import latency, timing

PROFILED = ("fastenc", "hf-sdpa")
GEMMS_ALONE = "fastenc-gemms-alone"  # the pseudo-provider timed in the throughput rounds (gemms_alone)


def batch1(bind, lats: dict, quick: bool) -> dict:
    """fastenc's and transformers sdpa's batch-1 time by category (fastenc.benchmark.latency), per workload:
    {workload: {provider: breakdown}}; bind(workload) -> {provider: call()}, lats: {workload: {provider: [ms]}}."""
    out: dict = {}
    cache: dict = {}
    for w in lats:
        for name, call in bind(w).items():
            if name not in PROFILED:
                continue
            b = latency.breakdown(call, calls=2 if quick else 5)
            b.update(latency.gemm_alone(b["gemm_shapes"], rounds=3 if quick else 7, cache=cache))
            b["p50_ms"] = timing.percentile(lats[w][name], 0.5)
            out.setdefault(w, {})[name] = b
    return out


def throughput(bind, per: dict, quick: bool) -> dict:
    """One profiled call of fastenc and of transformers sdpa per throughput workload (fixed, varlen), as batch1 does
    for batch 1, with gemm_floor_ms: fastenc's GEMMs of that call timed alone (the best of torch's plain and
    prepacked paths and fastenc's panels) or inside the call where that was less (latency.gemm_floor), the call's
    time if nothing but its GEMMs took any. A baseline's median over that floor (the rows' ceiling_ratio_vs_hf-sdpa)
    is the highest ratio a forward running those GEMMs at this machine's rate could reach."""
    out: dict = {}
    cache: dict = {}
    for w, samples in per.items():
        calls = bind(w)
        for name in PROFILED:
            if name not in calls or name not in samples:
                continue
            b = latency.breakdown(calls[name], calls=1)
            b.update(latency.gemm_alone(b["gemm_shapes"], rounds=3 if quick else 5, cache=cache))
            b["p50_ms"] = timing.summarize(samples[name]).median_ms
            b["gemm_floor_ms"] = latency.gemm_floor(b)
            out.setdefault(w, {})[name] = b
    return out


def gemms_alone(call, quick: bool, cache: dict):
    """A call running only the GEMMs one profiled run of `call` (fastenc's forward) makes, each shape on its fastest
    path alone (latency.gemm_replay): timed in the same interleaved rounds as the providers, baseline / it per round
    is the highest ratio a forward made of those GEMMs, at this machine's rate at that moment, could reach."""
    b = latency.breakdown(call, calls=1)
    latency.gemm_alone(b["gemm_shapes"], rounds=3 if quick else 5, cache=cache)
    return latency.gemm_replay(b["gemm_shapes"], cache)


def ceiling_fields(samples: dict, alone: list[float], baselines) -> dict:
    """fastenc's throughput-row fields from its GEMMs timed alone in the same rounds (`alone`, one sample per
    round beside samples[name] of each provider): their median, fastenc's time over them (median of the per-round
    ratios) and each baseline's paired ceiling, baseline time / GEMMs-alone time per round (median, 20-80%)."""
    import statistics

    out = {"gemms_alone_ms": timing.summarize(alone).median_ms,
           "paired_time_over_gemms_alone": statistics.median(t / a for t, a in zip(samples["fastenc"], alone))}
    for b in baselines:
        if b in samples:
            ratios = [bt / a for bt, a in zip(samples[b], alone)]
            out[f"paired_ceiling_vs_{b}"] = statistics.median(ratios)
            out[f"paired_ceiling_vs_{b}_q20_q80"] = [timing.percentile(ratios, q) for q in (0.2, 0.8)]
    return out
