"""`fastenc bench mlm-head`: the cost of the masked-LM head beside the encoder, CPU.

For BERT-base (vocab 30522) and ModernBERT-base (vocab 50368), random weights, batch 8 x 128, every round runs
interleaved (round-robin, rotating order) in one process:
  fe-encoder          fastenc's encoder alone (packed tokens)
  fe-encoder+sparse   fastenc's encoder + the masked-LM head at 15% of the tokens (positions=, as with labels=)
  fe-sparse-head      the head alone on those 15% (fixed hidden states)
  hf-dense-head       transformers' head on every token (fixed hidden states), as its ForMaskedLM computes it
  hf-mlm              transformers' whole ForMaskedLM forward (sdpa attention)
Reported per model: medians of the per-round ratios (with their 20-80% spread) of the sparse head to the
encoder (target <= 0.20), of transformers' dense head to fastenc's sparse head, and of transformers' dense head to
one encoder layer (the encoder's time / layers). Writes mlm_head.json (machine, versions, commit).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from fastenc.benchmark import options, report, timing
from fastenc.benchmark.options import UsageError

COMMAND = "mlm-head"
HELP = "the masked-LM head at 15%% of tokens vs the encoder and transformers' dense head"


def add_arguments(p) -> None:
    options.models(p, "comma-separated of bert-base, modernbert-base (default: both)")


def command(args, device: str, dtype: torch.dtype, out: Path) -> dict:
    return bench_mlm_head(out, quick=args.quick, models=options.split(args.models), repeats=args.repeats,
                          note=args.note)

BATCH, SEQ, FRACTION = 8, 128, 0.15


def _models(names):
    import transformers

    make = {"bert-base": lambda: transformers.BertForMaskedLM(transformers.BertConfig(attn_implementation="sdpa")),
            "modernbert-base": lambda: transformers.ModernBertForMaskedLM(
                transformers.ModernBertConfig(attn_implementation="sdpa"))}
    bad = [n for n in names if n not in make]
    if bad:
        raise UsageError(f"bench mlm-head: unknown model(s) {bad}; choose from {sorted(make)}")
    return {n: make[n] for n in names}


def _paired(num: list[float], den: list[float]) -> dict:
    r = sorted(a / b for a, b in zip(num, den))
    return {"median": timing.percentile(r, 0.5), "q20": timing.percentile(r, 0.2), "q80": timing.percentile(r, 0.8)}


def _hf_head(hf):
    """transformers' masked-LM head module (hidden (batch, seq, hidden) -> logits (batch, seq, vocab))."""
    if hasattr(hf, "cls"):
        return hf.cls
    return lambda h: hf.decoder(hf.head(h))


def bench_one(name: str, make, repeats: int, seed: int = 0) -> dict:
    import fastenc

    torch.manual_seed(seed)
    hf = make().eval()
    fe = fastenc.from_hf(hf, copy=False)
    cfg = fe.config
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, cfg.vocab_size, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    pick = torch.rand(BATCH, SEQ, generator=g) < FRACTION
    text = (ids, mask, None) if cfg.model_type == "bert" else (ids, mask)
    head = _hf_head(hf)
    with torch.inference_mode():
        x, batch = fe._encode(*text)
        x = x.clone()
        rows = pick.reshape(-1).nonzero().flatten()
        hidden = batch.pad(x)
        fns = {"fe-encoder": lambda: fe._encode(*text),
               "fe-encoder+sparse": lambda: fe(*text, positions=pick),
               "fe-sparse-head": lambda: fe.predict(x.index_select(0, rows)),
               "hf-dense-head": lambda: head(hidden),
               "hf-mlm": lambda: hf(input_ids=ids, attention_mask=mask).logits}
        samples = timing.interleaved(fns, "cpu", warmup=1, repeats=repeats)
    layers = cfg.num_hidden_layers
    per_layer = [e / layers for e in samples["fe-encoder"]]
    head_in_run = [max(a - b, 0.0) for a, b in zip(samples["fe-encoder+sparse"], samples["fe-encoder"])]
    return {
        "model": name, "vocab_size": cfg.vocab_size, "layers": layers, "batch": BATCH, "seq": SEQ,
        "predicted_tokens": int(rows.numel()), "times_ms": {k: timing.summarize(v).as_dict() for k, v in samples.items()},
        "sparse_head_over_encoder": _paired(samples["fe-sparse-head"], samples["fe-encoder"]),
        "sparse_head_in_run_over_encoder": _paired(head_in_run, samples["fe-encoder"]),
        "hf_dense_head_over_sparse_head": _paired(samples["hf-dense-head"], samples["fe-sparse-head"]),
        "hf_dense_head_over_one_layer": _paired(samples["hf-dense-head"], per_layer),
        "hf_mlm_over_fe_encoder_sparse": _paired(samples["hf-mlm"], samples["fe-encoder+sparse"]),
    }


def bench_mlm_head(out: Path, quick: bool = False, models=None, repeats: int | None = None, note: str | None = None):
    """Run the benchmark for `models` (default both), print a summary, write out/mlm_head.json."""
    names = models or ["bert-base", "modernbert-base"]
    makers = _models(names)
    meta = report.metadata("cpu", torch.float32, quick)
    results = []
    for name in names:
        t0 = time.perf_counter()
        r = bench_one(name, makers[name], repeats or (3 if quick else 7))
        results.append(r)
        t = r["times_ms"]
        print(f"{name}: encoder {t['fe-encoder']['median_ms']:.1f} ms, sparse head ({r['predicted_tokens']} tokens) "
              f"{t['fe-sparse-head']['median_ms']:.1f} ms = {r['sparse_head_over_encoder']['median']:.3f} x encoder "
              f"[{r['sparse_head_over_encoder']['q20']:.3f}, {r['sparse_head_over_encoder']['q80']:.3f}]; "
              f"transformers dense head {t['hf-dense-head']['median_ms']:.1f} ms = "
              f"{r['hf_dense_head_over_sparse_head']['median']:.1f} x sparse head, "
              f"{r['hf_dense_head_over_one_layer']['median']:.2f} x one layer ({time.perf_counter() - t0:.0f} s)")
    payload = {**meta, "note": note, "benchmark": "mlm-head", "results": results}
    path = report.write_json(Path(out) / "mlm_head.json", payload)
    return {"files": [path], "results": results}
