"""`fastenc bench embed`: the corpus job on real passages (docstrings of the installed packages) against
sentence-transformers' `encode` (which also sorts by length) and transformers with the same token-budget batches,
in one process, outputs checked (cosine >= 0.99999); with --quantize int8 the job int8 beside them, every provider's
agreement with fp32 sentence-transformers (cosine min and mean) beside its speed; the job's peak memory at two
corpus sizes (fresh processes); and the Ray engine's throughput at 1 and 2 actors beside the in-process job."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fastenc.benchmark import options, report, timing


def _hf_same_batching(hf, tok_model, texts, max_length, max_batch_tokens, pooling, normalize):
    """transformers (sdpa) over the job's own token-budget batches, mean/CLS pooled like the job."""
    from fastenc.corpus.batching import token_budget_batches
    from fastenc.corpus.job import tokenize

    seqs, _ = tokenize(tok_model, texts, max_length)
    out = np.empty((len(texts), hf.config.hidden_size), np.float32)
    with torch.inference_mode():
        for b in token_budget_batches(seqs, max_batch_tokens, 512):
            h = hf(input_ids=b.ids, attention_mask=b.mask.long()).last_hidden_state
            if pooling == "mean":
                m = b.mask.unsqueeze(-1).to(h.dtype)
                e = (h * m).sum(1) / m.sum(1).clamp(min=1)
            else:
                e = h[:, 0]
            if normalize:
                e = torch.nn.functional.normalize(e, dim=-1)
            out[b.rows] = e.float().numpy()
    return out


def _cos_min(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


_HWM = ("def hwm():\n"
        "    try:\n"
        "        return float(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM'))) / 1024\n"
        "    except (OSError, StopIteration):\n"
        "        import resource\n"
        "        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n")


def _peak_rss_mib(corpus: Path, out: Path) -> dict[str, float]:
    """The job alone in a fresh process: its peak RSS (MiB) once torch, fastenc and the model are loaded, and at the
    end of the job. Read as VmHWM, the high-water mark of the process's own memory: getrusage's ru_maxrss would
    report at least the RSS of this (benchmark) process, which a forked child inherits across exec on Linux."""
    code = (_HWM + "import sys, fastenc\nfrom fastenc.corpus.job import load_model\nm, _ = load_model()\na = hwm()\n"
            "fastenc.embed(sys.argv[1], m, out=sys.argv[2], overwrite=True)\nprint(a, hwm())\n")
    r = subprocess.run([sys.executable, "-c", code, str(corpus), str(out)], capture_output=True, text=True, check=True)
    loaded, peak = map(float, r.stdout.strip().splitlines()[-1].split())
    return {"model_loaded": loaded, "peak": peak}


MEMORY_SEED = 0  # the same-distribution corpora's fixed pseudo-random order


def _memory_rows(tmp: Path, sizes, passages: list[str]) -> dict:
    """The job's peak memory (_peak_rss_mib) at each corpus size, for two kinds of corpora made from the first
    max(sizes) docstring passages (`passages`: at least that many, in file order): 'same distribution' (those
    passages in a fixed pseudo-random order, each size its first `size`: every size samples the same mix of
    lengths, so a difference between sizes is growth with the number of texts) and 'first N' (the first `size` passages in file order, as before: the later files hold longer
    passages, so a bigger size also means longer texts)."""
    from fastenc.corpus.docstrings import shuffled, write_texts

    pool = passages[:max(sizes)]
    rows: dict = {"memory_corpora": {
        "same_distribution": f"the first {len(pool)} docstring passages, docstrings.shuffled(seed={MEMORY_SEED}); "
                             "each size takes the first `size` of them",
        "first_n": "the first `size` docstring passages in file order"}}
    for kind, texts in (("same_distribution", shuffled(pool, MEMORY_SEED)), ("first_n", pool)):
        mem = {}
        for size in sizes:
            src = tmp / f"{kind}{size}.txt"
            got = write_texts(src, texts[:size])
            mem[str(got)] = _peak_rss_mib(src, tmp / f"o{size}.npy")
        rows[f"peak_rss_mib_{kind}"] = mem
    return rows


COMMAND = "embed"
HELP = "the corpus job vs sentence-transformers and transformers (+ its peak memory and the Ray engine)"


def add_arguments(p) -> None:
    p.add_argument("--passages", type=int, default=20000, help="passages to embed (default 20000)")
    p.add_argument("--memory-sizes", default=None, help="comma-separated corpus sizes whose peak memory is measured "
                   "in fresh processes (default 10000,40000; none with --quick; 0 for none)")
    p.add_argument("--ray-actors", default=None, help="comma-separated actor counts for the Ray rows (default 1,2; "
                   "none with --quick; 0 for none)")
    p.add_argument("--no-throughput", action="store_true", help="skip the timed providers (memory and Ray rows only)")
    options.providers(p, "comma-separated substrings of the providers to keep (e.g. 'fastenc embed,model.encode')")
    p.add_argument("--quantize", default=None, metavar="int8",
                   help="also time the job int8 ('fastenc embed int8') and report every provider's agreement with "
                        "fp32 sentence-transformers (the memory and Ray rows stay fp32)")


def command(args, device: str, dtype: torch.dtype, out: Path) -> dict:
    from fastenc.corpus import quantization

    try:
        quantize = quantization.check(args.quantize, "--quantize")
        quantization.check_placement(quantize, device, dtype, "--quantize", ("--device ", "--dtype "))
    except ValueError as e:
        raise options.UsageError(str(e)) from None
    rounds = 0 if args.no_throughput else args.rounds if args.rounds is not None else 1 if args.quick else 2
    return bench_embed(out, n=args.passages, rounds=rounds,
                       memory_sizes=options.ints(args.memory_sizes, () if args.quick else (10000, 40000)),
                       ray_actors=options.ints(args.ray_actors, () if args.quick else (1, 2)),
                       providers=options.split(args.providers), note=args.note, quantize=quantize)


def bench_embed(out: Path, n: int = 20000, max_length: int = 256, rounds: int = 2, memory_sizes=(10000, 40000),
                ray_actors=(1, 2), providers=None, note: str | None = None, quantize: str | None = None) -> dict:
    """The benchmark (see the module docstring); quantize: None or 'int8' (adds the int8 job's row). Writes
    embed.json and embed.csv under `out`; returns {"payload", "files"}."""
    from fastenc.corpus import quantization
    from fastenc.corpus.docstrings import docstring_passages
    from fastenc.corpus.job import default_model_path

    quantization.check(quantize, "bench_embed: quantize")
    folder = default_model_path()
    # the passages are read once (~2.7 ms each, a walk over every installed module's docstrings): the timed corpus
    # and the Ray rows take the first n, the memory corpora the first max(memory_sizes); none when nothing needs them
    need_texts = rounds > 0 or bool(ray_actors)
    limit = max([n if need_texts else 0, *memory_sizes])
    passages = list(docstring_passages(limit)) if limit > 0 else []
    texts = passages[:n] if need_texts else []
    rows, loads, quant = _time_providers(folder, texts, max_length, rounds, providers, quantize) if rounds > 0 \
        else ([], [], None)
    payload = {"suite": "embed", **report.metadata("cpu", torch.float32, False), "note": note, "n": n,
               "max_length": max_length, "rounds": rounds, "loadavg_after_each_round": loads, "quantize": quant,
               "rows": rows}

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if memory_sizes:
            payload.update(_memory_rows(tmp, memory_sizes, passages))
        if ray_actors:
            payload["ray"] = _ray_rows(tmp, texts, ray_actors)
    out.mkdir(parents=True, exist_ok=True)
    files = [report.write_json(out / "embed.json", payload), report.write_csv(out / "embed.csv", rows)]
    cols = [("provider", "provider"), ("texts_per_s", "texts/s"), ("tokens_per_s", "tokens/s"),
            ("fastenc_speedup", "fastenc x"), ("paired_speedup_median", "paired x")]
    if quantize:
        cols += [("paired_speedup_vs_sentence_transformers", "x ST"), ("cos_min_vs_fastenc", "min cos fastenc"),
                 ("cos_min_vs_sentence_transformers", "min cos ST"),
                 ("cos_mean_vs_sentence_transformers", "mean cos ST")]
    else:
        cols += [("cos_min_vs_fastenc", "min cos")]
    shown = [{k: (f"{v:.5f}" if k.startswith("cos_") and isinstance(v, float) else v) for k, v in r.items()}
             for r in rows]  # cosines with 5 decimals (the table's 3 significant digits hide int8's error)
    print(report.table(shown, cols))
    if quant:
        print(f"int8: {quant['layers']} linear layers, int8 GEMM path {quant['int8_path']}; ST = sentence-transformers' "
              f"encode (fp32), x ST = its time over the provider's, paired by round")
    for key in ("peak_rss_mib_same_distribution", "peak_rss_mib_first_n"):
        if key in payload:
            print(f"RSS of the job alone (MiB) by corpus size, model loaded / peak ({key[13:].replace('_', ' ')}):",
                  json.dumps(payload[key]))
    for r in payload.get("ray", []):
        print(f"{r['engine']}: {r['texts_per_s']:.0f} texts/s ({r['vs_local']:.2f} of the in-process job)")
    return {"payload": payload, "files": files}


def _agreement(ref: np.ndarray, other: np.ndarray) -> dict:
    """Row-wise cosine of two (N, d) embedding arrays: {"cos_min", "cos_mean", "n"} (int8_peers.cosine_agreement,
    the measure int8_accuracy applies to every int8 provider)."""
    from fastenc.benchmark.int8_peers import cosine_agreement

    return cosine_agreement(torch.from_numpy(np.asarray(ref)), torch.from_numpy(np.asarray(other)))


def _time_providers(folder, texts: list[str], max_length: int, rounds: int, providers,
                    quantize: str | None = None) -> tuple[list[dict], list, dict | None]:
    """Each provider embeds the whole corpus once per round (round order alternating), after a warm-up on a slice;
    rows with texts/s, tokens/s, the speed ratio to fastenc's job and to sentence-transformers' encode (medians
    and per-round pairs) and the outputs' agreement (min cosine to fastenc's fp32 job; min and mean cosine to
    sentence-transformers). quantize 'int8' adds the job on the int8 model ('fastenc embed int8'). Returns (rows,
    load averages, the int8 model's quantization.describe() or None)."""
    import fastenc
    from fastenc.corpus import quantization

    model = fastenc.from_pretrained(folder).eval()
    d = model.encode_defaults
    pooling, normalize = d.get("pooling", "mean"), d.get("normalize", False)
    fns: dict = {"fastenc embed": lambda t: fastenc.embed(t, model, max_length=max_length).embeddings}
    quant = None
    if quantize:
        qmodel = fastenc.from_pretrained(folder).eval()
        quantization.apply(qmodel, quantize, "--quantize")
        quant = quantization.describe(qmodel)
        fns[f"fastenc embed {quantize}"] = lambda t: fastenc.embed(t, qmodel, max_length=max_length).embeddings
    want = set(providers) if providers else None
    try:
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(folder), device="cpu")
        st.max_seq_length = max_length
        fns["sentence-transformers (batch 32)"] = lambda t: st.encode(t, batch_size=32, convert_to_numpy=True,
                                                                      normalize_embeddings=normalize)
    except ImportError:
        print("sentence-transformers not installed: its row is skipped", file=sys.stderr)
    try:
        from transformers import AutoModel

        hf = AutoModel.from_pretrained(str(folder), attn_implementation="sdpa").eval()
        fns["transformers sdpa (same batches)"] = lambda t: _hf_same_batching(hf, model, t, max_length, 16384,
                                                                              pooling, normalize)
    except ImportError:
        print("transformers not installed: its row is skipped", file=sys.stderr)
    fns["fastenc model.encode (batch 32)"] = lambda t: model.encode(t, batch_size=32, max_length=max_length).numpy()
    if want:
        fns = {k: v for k, v in fns.items() if any(w in k for w in want)}
    # warm-up on a slice (threads, kernel caches, lazy imports), not on the whole corpus: at 20,000 passages a full
    # warm-up pass would cost as much as a timed round. The outputs compared below are those of the first round.
    warm = texts[:256]
    for fn in fns.values():
        fn(warm)
    results: dict = {}
    loads: list = []

    def keep(k):  # one pass over the corpus; the first round's output is the one compared
        return lambda: results.setdefault(k, fns[k](texts))
    samples = timing.interleaved({k: keep(k) for k in fns}, "cpu", warmup=0, repeats=rounds,
                                 on_round=lambda: loads.append(list(os.getloadavg())))
    times = {k: [ms / 1e3 for ms in v] for k, v in samples.items()}
    base = results["fastenc embed"]
    model.tokenizer.enable_truncation(max_length)
    n_tokens = sum(len(e.ids) for e in model.tokenizer.encode_batch(texts))
    rows = []
    st_name = next((k for k in results if k.startswith("sentence")), None)
    ref_st = results[st_name] if st_name is not None else None
    for k, ts in times.items():
        med = statistics.median(ts)
        agree = _agreement(ref_st, results[k]) if ref_st is not None else {}
        rows.append({"provider": k, "texts": len(texts), "tokens": n_tokens, "median_s": med,
                     "texts_per_s": len(texts) / med, "tokens_per_s": n_tokens / med,
                     "cos_min_vs_fastenc": _cos_min(results[k], base),
                     "cos_min_vs_sentence_transformers": agree.get("cos_min"),
                     "cos_mean_vs_sentence_transformers": agree.get("cos_mean")})
    fe = next(r for r in rows if r["provider"] == "fastenc embed")
    for r in rows:
        r["fastenc_speedup"] = r["median_s"] / fe["median_s"]
        # the same ratio round by round (each round runs every provider back to back): median and spread
        paired = [t / f for t, f in zip(times[r["provider"]], times["fastenc embed"])]
        r["paired_speedups"] = paired
        r["paired_speedup_median"] = statistics.median(paired)
        if st_name is not None:  # sentence-transformers' time over this provider's: > 1 is faster than it
            vs_st = [s / t for t, s in zip(times[r["provider"]], times[st_name])]
            r["speedup_vs_sentence_transformers"] = statistics.median(times[st_name]) / r["median_s"]
            r["paired_speedups_vs_sentence_transformers"] = vs_st
            r["paired_speedup_vs_sentence_transformers"] = statistics.median(vs_st)
    return rows, loads, quant


def _ray_rows(tmp: Path, texts: list[str], actors_list) -> list[dict]:
    try:
        import ray
    except ImportError:
        print("ray not installed: the Ray rows are skipped", file=sys.stderr)
        return []
    import fastenc
    from fastenc.corpus.ray_engine import local_ray_options

    src = tmp / "ray.txt"
    src.write_text("\n".join(texts) + "\n")
    ray.init(**local_ray_options())  # as the job starts Ray itself (workers at the driver's niceness)
    rows = []
    try:
        t0 = time.perf_counter()
        fastenc.embed(str(src), out=tmp / "local.parquet", overwrite=True)
        local = len(texts) / (time.perf_counter() - t0)
        rows.append({"engine": "local", "texts_per_s": local, "vs_local": 1.0})
        for a in actors_list:
            t0 = time.perf_counter()
            fastenc.embed(str(src), out=tmp / f"ray{a}.parquet", engine="ray", actors=a, overwrite=True)
            rate = len(texts) / (time.perf_counter() - t0)
            rows.append({"engine": f"ray, {a} actor(s)", "texts_per_s": rate, "vs_local": rate / local})
    finally:
        ray.shutdown()
    return rows
