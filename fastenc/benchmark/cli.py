"""`fastenc bench <subcommand>`: the wiring of the benchmark programs. Each subcommand's module declares its name
(COMMAND), its help (HELP), its own options (add_arguments) and its run (command(args, device, dtype, out)); the
options every subcommand takes (device, dtype, quick, output folder, threads, note, timed rounds) and the checks
made before any work live here."""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

import torch

from fastenc.benchmark.options import DTYPES

# The subcommand modules, in the order `fastenc bench --help` lists them.
SUBCOMMANDS = ("kernel_suite", "model_suite", "train", "embed", "mlm_head", "retrieval", "serve", "attention_cpu",
               "attention_relative", "lora_cost", "report")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                   help="benchmark dtype (default: bf16 on cuda, fp32 on cpu)")
    p.add_argument("--quick", action="store_true", help="fewer shapes/models/repeats (under 3 minutes on 2 CPU cores)")
    p.add_argument("--out", default="bench-results", help="output folder (default: ./bench-results)")
    p.add_argument("--threads", type=int, default=None, help="torch/ONNX Runtime intra-op threads (default: all cores)")
    p.add_argument("--note", default=None, help="free text stored in the JSON and RESULTS.md (e.g. machine load)")
    p.add_argument("--rounds", type=int, default=None,
                   help="timed rounds where a subcommand takes them (models: batch-1 rounds, default 5 with "
                        "--quick, else 20, more up to 5 s; embed: rounds over the corpus, default 2, quick 1)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed rounds per case where a subcommand takes them (train: default 3, quick 2; "
                        "mlm-head: default 7, quick 3; retrieval: default 9, quick 3; attention-cpu: default 7, quick 3; "
                        "attention-relative: DeBERTa 7 and bias rows 15, quick 3 and 5; lora: default 15)")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("bench", help="kernel, model, training, corpus and server benchmarks against the "
                                            "baselines (JSON/CSV/PNG)")
    mods = [importlib.import_module(f"fastenc.benchmark.{name}") for name in SUBCOMMANDS]
    sub = p.add_subparsers(dest="what", required=True, metavar="{" + ",".join(m.COMMAND for m in mods) + "}")
    for mod in mods:
        sp = sub.add_parser(mod.COMMAND, help=mod.HELP, description=mod.HELP)
        _common(sp)
        mod.add_arguments(sp)
        sp.set_defaults(func=run, bench_module=mod)
    return p


def run(args) -> int:
    import fastenc  # noqa: F401  (registers every op)
    from fastenc import cli_checks
    from fastenc.benchmark.options import UsageError

    chosen = cli_checks.device(args.device)
    device = args.device if chosen is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    for flag in ("threads", "rounds", "repeats", "passages"):
        cli_checks.at_least(getattr(args, flag, None), 1, "--" + flag)
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    try:
        res = _run_suite(args, device, dtype, Path(args.out))
    except UsageError as e:
        print(f"fastenc bench: {e}", file=sys.stderr)
        return 2
    if isinstance(res, int):
        return res
    print(f"\nwrote {', '.join(str(p) for p in res['files'])} in {time.perf_counter() - t0:.0f} s")
    if res.get("failures"):
        print(f"fastenc bench: {len(res['failures'])} fastenc provider(s) failed (see above)", file=sys.stderr)
        return 1
    return 0


def _run_suite(args, device: str, dtype: torch.dtype, out: Path):
    """The subcommand's own run: a result dict (files written, failures) or an exit code."""
    return args.bench_module.command(args, device, dtype, out)
