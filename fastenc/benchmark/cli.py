"""`fastenc bench kernels|models [--device] [--dtype] [--quick] [--out DIR]`: runs the benchmarks with a
progress bar, prints a table, and writes JSON + CSV + PNG plots into the output folder."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16,
          "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("bench", help="kernel and model benchmarks against the baselines (JSON/CSV/PNG)")
    p.add_argument("what", choices=["kernels", "models", "train", "embed", "mlm-head", "serve", "report"],
                   help="which suite to run ('embed': the corpus job vs sentence-transformers and transformers); "
                        "'train': training steps vs transformers (+ PEFT for LoRA); "
                        "'serve': the HTTP server over loopback vs the in-process model and Infinity; "
                        "'mlm-head': the masked-LM head at 15%% of tokens vs the encoder and transformers' dense head; "
                        "'report' writes RESULTS.md from the JSON files in --out")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                   help="benchmark dtype (default: bf16 on cuda, fp32 on cpu)")
    p.add_argument("--quick", action="store_true", help="fewer shapes/models/repeats (under 3 minutes on 2 CPU cores)")
    p.add_argument("--out", default="bench-results", help="output folder (default: ./bench-results)")
    p.add_argument("--threads", type=int, default=None, help="torch/ONNX Runtime intra-op threads (default: all cores)")
    p.add_argument("--ops", default=None, help="kernels: comma-separated ops to run (default: all)")
    p.add_argument("--shapes", default=None, help="kernels: comma-separated substrings of shape names to keep")
    p.add_argument("--models", default=None, help="models: comma-separated names of fastenc.benchmark.models.MODELS "
                   "(bert-base, modernbert-base, vit-b16, deit-base, distilbert-base, ..., minilm)")
    p.add_argument("--same-process", action="store_true",
                   help="models, train: run every model in this process (default: one fresh process per model when "
                        "several run)")
    p.add_argument("--providers", default=None,
                   help="comma-separated providers to keep (kernels: e.g. cpu,reference,torch-eager,torch-compile; "
                        "models: fastenc,hf-eager,hf-sdpa,hf-compile,onnxruntime)")
    p.add_argument("--breakdown", action="store_true",
                   help="models: where fastenc's and transformers sdpa's batch-1 time goes (GEMM vs the same GEMMs "
                        "alone, fastenc's ops, other ops, Python/dispatch), under torch.profiler; train: the same "
                        "for one step of fastenc and the baseline, with fastenc's GEMM floor and the ceiling ratio")
    p.add_argument("--workloads", default=None,
                   help="models: comma-separated of fixed, varlen, latency (default: all; batch-1 latency always "
                        "runs); train: of fixed, varlen (default: both; ViT has fixed only)")
    p.add_argument("--rounds", type=int, default=None,
                   help="models: timed batch-1 rounds (default: 5 with --quick, else 20, more up to 5 s); "
                        "embed: timed rounds over the corpus (default 2; quick 1)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile baselines (they compile for minutes on CPU)")
    p.add_argument("--modes", default=None, help="train: comma-separated of full, lora (default: both)")
    p.add_argument("--repeats", type=int, default=None, help="train: timed rounds per workload (default 3; quick 2)")
    p.add_argument("--attention-dropout", default="config", help="train: 'config' (the models' own attention-"
                   "probability dropout, BERT 0.1; default) or 'off' (0 for every provider)")
    p.add_argument("--optimizer", default="adamw_torch_fused",
                   help="train: the AdamW every provider steps with, by transformers' name: adamw_torch_fused "
                        "(torch.optim.AdamW(fused=True), the Trainer's default; default) or adamw_torch")
    p.add_argument("--passages", type=int, default=20000, help="embed: passages to embed (default 20000)")
    p.add_argument("--memory-sizes", default=None, help="embed: comma-separated corpus sizes whose peak memory is "
                   "measured in fresh processes (default 10000,40000; none with --quick; 0 for none)")
    p.add_argument("--ray-actors", default=None, help="embed: comma-separated actor counts for the Ray rows "
                   "(default 1,2; none with --quick; 0 for none)")
    p.add_argument("--no-throughput", action="store_true", help="embed: skip the timed providers (memory and Ray "
                   "rows only)")
    p.add_argument("--model-dir", default=None, help="serve: model folder (default: the embedded MiniLM)")
    p.add_argument("--concurrency", default="1,8,32", help="serve: comma-separated client concurrencies")
    p.add_argument("--texts-per-request", type=int, default=8, help="serve: texts in each request (default 8)")
    p.add_argument("--requests", type=int, default=400, help="serve: requests per concurrency level (default 400)")
    p.add_argument("--time-cap", type=float, default=60.0, help="serve: seconds at most per level (default 60)")
    p.add_argument("--overload-seconds", type=float, default=30.0,
                   help="serve: seconds of 8x the in-flight limit (default 30; 0 for none)")
    p.add_argument("--infinity", default=None, help="serve: path of the infinity_emb command (default: on PATH)")
    p.add_argument("--ray-replicas", type=int, default=0, help="serve: also run N Ray Serve replicas (default 0)")
    p.add_argument("--note", default=None, help="free text stored in the JSON and RESULTS.md (e.g. machine load)")
    p.add_argument("--no-plots", action="store_true", help="write JSON and CSV only")
    p.add_argument("--backward", action="store_true",
                   help="kernels: forward + backward of every op vs torch eager autograd, torch.compile and SDPA "
                        "(writes backward.json)")
    p.set_defaults(func=run)
    return p


def _ints(v: str | None, default: tuple) -> tuple:
    if v is None:
        return default
    try:
        got = tuple(int(x) for x in v.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"expected comma-separated integers, got {v!r}") from None
    if any(x < 0 for x in got):
        raise SystemExit(f"expected non-negative integers, got {v!r}")
    return tuple(x for x in got if x > 0)


def _split(v: str | None) -> list[str] | None:
    return [x.strip() for x in v.split(",") if x.strip()] if v else None


def run(args) -> int:
    import fastenc  # noqa: F401  (registers every op)
    from fastenc.benchmark import suite
    from fastenc.benchmark.kernels import UsageError

    from fastenc import cli_checks

    chosen = cli_checks.device(args.device)
    device = args.device if chosen is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    for flag in ("threads", "rounds", "repeats", "passages"):
        cli_checks.at_least(getattr(args, flag), 1, "--" + flag)
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    out = Path(args.out)
    if args.what == "report":
        from fastenc.benchmark import report
        if not (out / "models.json").exists() and not (out / "kernels.json").exists():
            print(f"fastenc bench report: no models.json or kernels.json in {out}", file=sys.stderr)
            return 2
        (out / "RESULTS.md").write_text(report.results_markdown(out))
        print(f"wrote {out / 'RESULTS.md'}")
        return 0
    try:
        res = _run_suite(args, suite, device, dtype, out)
    except UsageError as e:
        print(f"fastenc bench: {e}", file=sys.stderr)
        return 2
    print(f"\nwrote {', '.join(str(p) for p in res['files'])} in {time.perf_counter() - t0:.0f} s")
    if res.get("failures"):
        print(f"fastenc bench: {len(res['failures'])} fastenc provider(s) failed (see above)", file=sys.stderr)
        return 1
    return 0


def _run_suite(args, suite, device, dtype, out):
    if args.what == "serve":
        from fastenc import cli_checks
        from fastenc.benchmark.serve import bench_serve
        for flag in ("texts_per_request", "requests"):
            cli_checks.at_least(getattr(args, flag), 1, "--" + flag.replace("_", "-"))
        levels = _ints(args.concurrency, ())
        if not levels:
            raise UsageError(f"--concurrency must list positive integers, got {args.concurrency!r}")
        return bench_serve(out, model_dir=args.model_dir, concurrencies=levels,
                           texts_per_request=args.texts_per_request, requests_per_level=args.requests,
                           time_cap=args.time_cap, overload_seconds=args.overload_seconds,
                           infinity=args.infinity, ray_replicas=args.ray_replicas, threads=args.threads,
                           note=args.note)
    if args.what == "embed":
        from fastenc.corpus.bench import bench_embed
        rounds = 0 if args.no_throughput else args.rounds if args.rounds is not None else 1 if args.quick else 2
        return bench_embed(out, n=args.passages, rounds=rounds,
                           memory_sizes=_ints(args.memory_sizes, () if args.quick else (10000, 40000)),
                           ray_actors=_ints(args.ray_actors, () if args.quick else (1, 2)),
                           providers=_split(args.providers), note=args.note)
    if args.what == "mlm-head":
        from fastenc.benchmark.mlm_head import bench_mlm_head
        return bench_mlm_head(out, quick=args.quick, models=_split(args.models), repeats=args.repeats, note=args.note)
    if args.what == "kernels" and args.backward:
        from fastenc.benchmark.backward import bench_backward
        return bench_backward(device, dtype, quick=args.quick, out=out, ops=_split(args.ops),
                              compile_ref=not args.no_compile, note=args.note)
    if args.what == "train":
        from fastenc.benchmark.train import bench_train
        return bench_train(quick=args.quick, out=out, models=_split(args.models), modes=_split(args.modes),
                           providers=_split(args.providers), compile_hf=not args.no_compile,
                           plots=not args.no_plots, note=args.note, repeats=args.repeats,
                           attention_dropout=args.attention_dropout, workloads=_split(args.workloads),
                           optimizer=args.optimizer, breakdown=args.breakdown,
                           isolate=False if args.same_process else None)
    if args.what == "kernels":
        return suite.bench_kernels(device, dtype, quick=args.quick, out=out, ops=_split(args.ops),
                                   shapes=_split(args.shapes), providers=_split(args.providers),
                                   compile_ref=not args.no_compile, plots=not args.no_plots, note=args.note)
    return suite.bench_models(device, dtype, quick=args.quick, out=out, models=_split(args.models),
                              providers=_split(args.providers), compile_hf=not args.no_compile,
                              plots=not args.no_plots, note=args.note, isolate=False if args.same_process else None,
                              breakdown=args.breakdown, workloads=_split(args.workloads),
                              rounds=args.rounds)
