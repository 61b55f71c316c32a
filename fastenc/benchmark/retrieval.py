"""`fastenc bench retrieval`: the cost of encode()'s retrieval outputs (fastenc.models.retrieval) beside the encoder
forward they come from, CPU, one process, every round interleaved (round-robin, rotating order).

SPLADE (a BERT-base masked-LM model, vocab 30522, random weights, batch 8 x 128):
  encoder           the encoder forward alone (packed last hidden states: fastenc's _encode)
  sparse            encode(output="sparse"): the forward, the MLM transform, fastenc.ops.sparse_max (never forms the
                    (tokens, vocab) logits) and the per-text non-zero (index, value) lists
  sparse-head       the head alone on fixed hidden states (MLM transform + sparse_max)
  dense-logits-head the same weights through the (tokens, vocab) logits (sparse_max's reference backend)
  -> sparse / encoder time (target <= 1.3), and the head's peak extra memory (RSS above what was held before the
     call, or CUDA's allocator peak) over the bytes of the fp32 (tokens, vocab) logits (target <= 10%), with the
     dense-logits head's peak beside it.
ColBERT (BERT-base encoder, a random 768 -> 128 linear projection, batch 8 x 128):
  dense             encode(output="dense"): the pooled embeddings
  multi-vector      encode(output="multi_vector", projection=...): one normalized vector per token, ragged
  -> multi-vector / dense time (target <= 1.05).
Ratios are the medians of the per-round ratios with their 20-80% spread. Writes retrieval.json (machine,
versions, commit)."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from fastenc.benchmark import options, report, timing
from fastenc.benchmark.options import UsageError

COMMAND = "retrieval"
HELP = "encode(output='sparse') (SPLADE) and output='multi_vector' (ColBERT) vs the encoder forward / pooled output"

BATCH, SEQ, COLBERT_DIM = 8, 128, 128
TARGETS = {"sparse_over_encoder": 1.3, "head_peak_over_logits": 0.10, "multi_vector_over_dense": 1.05}
CASES = ("splade", "colbert")


def add_arguments(p) -> None:
    options.models(p, "comma-separated of splade, colbert (default: both; both run BERT-base)")


def command(args, device: str, dtype: torch.dtype, out: Path) -> dict:
    if str(device) != "cpu" or dtype != torch.float32:
        raise UsageError(f"bench retrieval: runs on the CPU in fp32; got --device {device} "
                         f"--dtype {str(dtype).replace('torch.', '')}")
    return bench_retrieval(out, quick=args.quick, cases=options.split(args.models), repeats=args.repeats,
                           note=args.note)


def _models():
    """case -> a builder of its transformers model (random weights, sdpa attention)."""
    import transformers

    cfg = lambda: transformers.BertConfig(attn_implementation="sdpa")  # noqa: E731  (BERT-base)
    return {"splade": lambda: transformers.BertForMaskedLM(cfg()),
            "colbert": lambda: transformers.BertModel(cfg(), add_pooling_layer=False)}


def _paired(num: list[float], den: list[float]) -> dict:
    r = sorted(a / b for a, b in zip(num, den))
    return {"median": timing.percentile(r, 0.5), "q20": timing.percentile(r, 0.2), "q80": timing.percentile(r, 0.8)}


def _inputs(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (BATCH, SEQ), generator=g)
    return ids, torch.ones(BATCH, SEQ, dtype=torch.long)


def bench_splade(make, repeats: int, seed: int = 0, device: str = "cpu") -> dict:
    """The SPLADE case on the masked-LM model `make()` builds (see the module doc)."""
    import fastenc
    from fastenc import ops
    from fastenc.models import retrieval

    torch.manual_seed(seed)
    fe = fastenc.from_hf(make().eval(), copy=False).to(device)
    cfg = fe.config
    ids, mask = (t.to(device) for t in _inputs(cfg.vocab_size, seed))
    with torch.inference_mode():
        x, batch = fe._encode(ids, mask, None)
        x = x.clone()

        def dense_logits_head():
            y, w, b = fe.mlm_projection(x)
            return ops.sparse_max(y.contiguous(), batch.cu_seqlens, w.to(y.dtype), None if b is None else
                                  b.to(y.dtype), backend="reference")

        fns = {"encoder": lambda: fe._encode(ids, mask, None),
               "sparse": lambda: fe.encode(ids, attention_mask=mask, output="sparse"),
               "sparse-head": lambda: retrieval.sparse_weights(fe, x, batch),
               "dense-logits-head": dense_logits_head}
        got = retrieval.sparse_weights(fe, x, batch)
        want = dense_logits_head()
        max_err = float((got - want).abs().max())
        samples = timing.interleaved(fns, device, warmup=1, repeats=repeats)
        head_mib, how = timing.peak_memory(fns["sparse-head"], device)
        dense_mib, _ = timing.peak_memory(dense_logits_head, device)
    tokens = int(mask.sum())
    logits_mib = tokens * cfg.vocab_size * 4 / 2**20
    return {"case": "splade", "model": "bert-base masked LM (random weights)", "vocab_size": cfg.vocab_size,
            "batch": BATCH, "seq": SEQ, "tokens": tokens,
            "times_ms": {k: timing.summarize(v).as_dict() for k, v in samples.items()},
            "sparse_over_encoder": _paired(samples["sparse"], samples["encoder"]),
            "sparse_head_over_encoder": _paired(samples["sparse-head"], samples["encoder"]),
            "dense_logits_head_over_sparse_head": _paired(samples["dense-logits-head"], samples["sparse-head"]),
            "head_peak_extra_mib": head_mib, "dense_logits_head_peak_extra_mib": dense_mib,
            "logits_mib": logits_mib, "head_peak_over_logits": head_mib / logits_mib, "memory_measured_by": how,
            "max_abs_err_vs_dense_logits": max_err,
            "targets": {k: TARGETS[k] for k in ("sparse_over_encoder", "head_peak_over_logits")}}


def bench_colbert(make, repeats: int, seed: int = 0, device: str = "cpu") -> dict:
    """The ColBERT case on the encoder `make()` builds, with a random (COLBERT_DIM, hidden) projection."""
    import fastenc

    torch.manual_seed(seed)
    fe = fastenc.from_hf(make().eval(), copy=False).to(device)
    cfg = fe.config
    proj = torch.nn.Linear(cfg.hidden_size, COLBERT_DIM).to(device)
    ids, mask = (t.to(device) for t in _inputs(cfg.vocab_size, seed))
    with torch.inference_mode():
        fns = {"dense": lambda: fe.encode(ids, attention_mask=mask),
               "multi-vector": lambda: fe.encode(ids, attention_mask=mask, output="multi_vector", projection=proj)}
        mv = fns["multi-vector"]()
        samples = timing.interleaved(fns, device, warmup=1, repeats=repeats)
    return {"case": "colbert", "model": "bert-base encoder (random weights)", "batch": BATCH, "seq": SEQ,
            "projection": [COLBERT_DIM, cfg.hidden_size], "vectors": list(mv.vectors.shape),
            "times_ms": {k: timing.summarize(v).as_dict() for k, v in samples.items()},
            "multi_vector_over_dense": _paired(samples["multi-vector"], samples["dense"]),
            "targets": {"multi_vector_over_dense": TARGETS["multi_vector_over_dense"]}}


def _summary(r: dict) -> str:
    t = r["times_ms"]
    if r["case"] == "splade":
        q, m = r["sparse_over_encoder"], r["head_peak_over_logits"]
        return (f"splade: encoder {t['encoder']['median_ms']:.1f} ms, encode(output='sparse') "
                f"{t['sparse']['median_ms']:.1f} ms = {q['median']:.3f} x encoder [{q['q20']:.3f}, {q['q80']:.3f}] "
                f"(target <= {TARGETS['sparse_over_encoder']}); head peak {r['head_peak_extra_mib']:.1f} MiB = "
                f"{100 * m:.1f}% of the {r['logits_mib']:.0f} MiB logits (target <= "
                f"{100 * TARGETS['head_peak_over_logits']:.0f}%; through the logits: "
                f"{r['dense_logits_head_peak_extra_mib']:.1f} MiB)")
    q = r["multi_vector_over_dense"]
    return (f"colbert: encode() pooled {t['dense']['median_ms']:.1f} ms, output='multi_vector' "
            f"{t['multi-vector']['median_ms']:.1f} ms = {q['median']:.3f} x [{q['q20']:.3f}, {q['q80']:.3f}] "
            f"(target <= {TARGETS['multi_vector_over_dense']})")


def bench_retrieval(out: Path, quick: bool = False, cases=None, repeats: int | None = None, note: str | None = None,
                    device: str = "cpu") -> dict:
    """Run `cases` (default both), print a summary line each, write out/retrieval.json."""
    names = cases or list(CASES)
    bad = [n for n in names if n not in CASES]
    if bad:
        raise UsageError(f"bench retrieval: --models: unknown {bad}; choose from {', '.join(CASES)}")
    makers = _models()
    meta = report.metadata(device, torch.float32, quick)
    meta["threads"] = torch.get_num_threads()
    results = []
    for name in names:
        t0 = time.perf_counter()
        run = bench_splade if name == "splade" else bench_colbert
        r = run(makers[name], repeats or (3 if quick else 9), device=device)
        r["elapsed_s"] = time.perf_counter() - t0
        results.append(r)
        print(_summary(r))
    payload = {**meta, "note": note, "benchmark": "retrieval", "targets": TARGETS, "results": results}
    path = report.write_json(Path(out) / "retrieval.json", payload)
    return {"files": [path], "results": results}
