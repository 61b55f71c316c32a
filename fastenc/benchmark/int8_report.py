"""The printed tables and RESULTS.md section of `fastenc bench models --quantize int8`: speed beside accuracy, with
ratios against fastenc fp32 and the best int8 peer."""
from __future__ import annotations

from fastenc.benchmark import tables

BEST = "best_int8_peer"  # ratio_vs_best_int8_peer, and the row's best_int8_peer names it

ACCURACY_COLS = [("emb_cos_min", "cos min"), ("emb_cos_mean", "cos mean"), ("top1_agreement", "top-1 agree"),
                 ("heldout_accuracy", "held-out acc"), ("unseen_accuracy", "unseen acc")]


def _shown(rows: list[dict]) -> list[dict]:
    """Rows with the accuracy fields as text that keeps their digits (cosines to 6 places, fractions in %)."""
    out = []
    for r in rows:
        r = dict(r)
        for k, _ in ACCURACY_COLS:
            v = r.get(k)
            if isinstance(v, float):
                r[k] = f"{v:.6f}" if k.startswith("emb_") else f"{v:.2%}"
        out.append(r)
    return out


def _q(row: dict, key: str) -> str:
    q = row.get(f"{key}_q20_q80")
    return f" [{q[0]:.2f}, {q[1]:.2f}]" if q else ""


def throughput_table(results: list[dict]) -> str:
    """Throughput rows: speed, ratios (paired) to fastenc fp32 and the best int8 peer, accuracy; then the
    ratio lines of fastenc-int8 and the notes of providers not timed."""
    rows = [r for res in results for r in res["rows"]]
    cols = [("model", "model"), ("workload", "workload"), ("provider", "provider"), ("throughput", "units/s"),
            ("median_ms", "median ms"), ("peak_mem_mib", "peak MiB"), ("paired_ratio_vs_fastenc", "x fastenc"),
            (f"paired_ratio_vs_{BEST}", "x best int8"), ("paired_ratio_vs_hf-sdpa", "x hf-sdpa")] + ACCURACY_COLS[:3]
    text = tables.table(_shown(rows), cols)
    lines = []
    for r in rows:
        if r["provider"] != "fastenc-int8":
            continue
        parts = []
        if "paired_ratio_vs_fastenc" in r:
            parts.append(f"{r['paired_ratio_vs_fastenc']:.2f}x fastenc fp32{_q(r, 'paired_ratio_vs_fastenc')}")
        if f"paired_ratio_vs_{BEST}" in r:
            parts.append(f"{r[f'paired_ratio_vs_{BEST}']:.2f}x the best int8 peer ({r[BEST]})"
                         f"{_q(r, f'paired_ratio_vs_{BEST}')}")
        if parts:
            lines.append(f"  {r['model']} {r['workload']}: fastenc-int8 = " + ", ".join(parts))
    if lines:
        text += "\n\nint8 throughput, paired ratios [20-80%] (higher is better):\n" + "\n".join(lines)
    return text + _not_timed(results)


def _not_timed(results: list[dict]) -> str:
    notes = [f"  {res['model']} {p}: {why}" for res in results for p, why in res["skipped"].items()]
    return "\n\nnot timed:\n" + "\n".join(notes) if notes else ""


def latency_table(results: list[dict]) -> str:
    """Batch-1 p50/p95 per provider with its time over fastenc fp32's and over the best int8 peer's (paired)."""
    rows = [r for res in results for r in res.get("latency_rows", [])]
    if not rows:
        return ""
    cols = [("model", "model"), ("workload", "workload"), ("provider", "provider"), ("p50_ms", "p50 ms"),
            ("p95_ms", "p95 ms"), ("n", "n"), ("paired_time_ratio_vs_fastenc", "time / fastenc"),
            (f"paired_time_ratio_vs_{BEST}", "time / best int8"), (BEST, "best int8 peer")]
    return "\nbatch-1 latency (time ratios paired; lower is better):\n" + tables.table(rows, cols)


def accuracy_table(results: list[dict]) -> str:
    """Per model: each provider's accuracy against fp32 transformers, and what it was measured on."""
    parts = []
    for res in results:
        acc = res.get("accuracy")
        if not acc:
            continue
        if "error" in acc:
            parts.append(f"\naccuracy of {res['model']}: not measured: {acc['error']}")
            continue
        emb, cls, ft = acc.get("embeddings", {}), acc.get("classification", {}), acc.get("finetuned", {})
        rows = [{"provider": n, **v} for n, v in acc.get("summary", {}).items()]
        cols = [("provider", "provider")] + [c for c in ACCURACY_COLS if any(c[0] in r for r in rows)]
        lines = [f"\naccuracy of {res['model']} against {acc['reference']}:", tables.table(_shown(rows), cols)]
        what = emb.get("passages") or emb.get("images")
        lines.append(f"  embeddings: {emb.get('n')} inputs ({what}; tokens: {emb.get('tokens', '-')})")
        if cls:
            lines.append(f"  classification: top-1 agreement over the same inputs; head: {cls.get('head')}")
        for part in ("heldout", "unseen"):
            if part in ft:
                lines.append(f"  {part} ({ft[part]['n']}): {ft[part]['what']}")
        if ft.get("classifier"):
            c = ft["classifier"]
            own = c.get("example_heldout_accuracy")
            lines.append(f"  fine-tuned classifier: {c.get('folder')} ({'cached' if c.get('cached') else 'trained now'}"
                         + (f"; the example's own held-out accuracy {own:.1%})" if own is not None else ")"))
        skipped = {**acc.get("skipped", {}), **ft.get("skipped", {})}
        lines += [f"  not measured: {n}: {why}" for n, why in skipped.items()]
        parts.append("\n".join(lines))
    return "\n".join(parts)


def markdown(d: dict) -> str:
    """The RESULTS.md section of an int8 models.json: throughput with ratios and accuracy, batch-1 latency."""
    m = d["machine"]
    head = (f"int8 GEMM path: {m.get('int8_isa')} (CPU flags {m.get('cpu_flags')}). Ratios are paired (the median of "
            "the per-round ratios of interleaved samples): throughput over fastenc fp32's and over the best int8 "
            "peer's; accuracy against fp32 transformers.")
    cols = [("model", "model"), ("workload", "workload"), ("provider", "provider"), ("throughput", "throughput"),
            ("unit", "unit"), ("paired_ratio_vs_fastenc", "x fastenc fp32"), (f"paired_ratio_vs_{BEST}", "x best int8"),
            (BEST, "best int8 peer")] + ACCURACY_COLS
    lat = [("model", "model"), ("workload", "workload"), ("provider", "provider"), ("p50_ms", "p50 ms"),
           ("paired_time_ratio_vs_fastenc", "time / fastenc fp32"),
           (f"paired_time_ratio_vs_{BEST}", "time / best int8")]
    skipped = [f"- {x['model']} {p}: {why}" for x in d["models"] for p, why in x["skipped"].items()]
    out = [head, "", tables._md_table(_shown(d["rows"]), cols), "",
           tables._md_table(d.get("latency_rows", []), lat)]
    if skipped:
        out += ["", "Not timed:", *skipped]
    return "\n".join(out)
