"""`fastenc embed INPUT... --out OUT`: the corpus job from the command line."""
from __future__ import annotations

import argparse
import sys


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "embed", help="embed a corpus: txt/jsonl/csv/parquet files, a folder or stdin -> parquet shards or .npy",
        description="Embed every row of the inputs with token-budget batches into sharded, resumable output.")
    p.add_argument("inputs", nargs="+", help="files (.txt one text a line, .jsonl, .csv, .parquet), folders, or - "
                                             "for standard input")
    p.add_argument("--out", required=True, help="OUT.parquet (a folder of shards + manifest) or OUT.npy")
    p.add_argument("--model", default=None, help="model folder (default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--text-field", default="text", help="field holding the text in jsonl/csv/parquet (default text)")
    p.add_argument("--id-field", default=None, help="field holding the row id (default: row numbers)")
    p.add_argument("--stdin-format", default="txt", choices=("txt", "jsonl", "csv"))
    p.add_argument("--pooling", choices=("mean", "cls"), default=None)
    p.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--max-length", type=int, default=None, help="tokens per text; longer texts are cut and counted")
    p.add_argument("--max-batch-tokens", type=int, default=16384, help="padded tokens per batch (default 16384)")
    p.add_argument("--max-batch-size", type=int, default=512)
    p.add_argument("--window", type=int, default=4096, help="texts sorted by length together; rows per shard")
    p.add_argument("--on-bad", choices=("skip", "error"), default="error",
                   help="a bad row (empty, non-string, missing field, undecodable): stop naming it, or skip and count")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None)
    p.add_argument("--resume", action="store_true", help="continue an interrupted run from its shards")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--engine", choices=("local", "ray"), default="local")
    p.add_argument("--address", default=None, help="Ray cluster address (default: start a local Ray instance)")
    p.add_argument("--actors", type=int, default=1, help="Ray: model actors")
    p.add_argument("--gpus-per-actor", type=float, default=0.0)
    p.add_argument("--quantize", default=None, metavar="int8",
                   help="run the model int8 (fastenc.quantize after it loads; CPU fp32 only); recorded in the "
                        "manifest: --resume refuses to change it")
    p.add_argument("--dimensions", type=int, default=None, metavar="K",
                   help="keep the first K dimensions of each embedding (Matryoshka), re-normalized when normalizing; "
                        "recorded in the manifest: --resume refuses to change it")
    p.add_argument("--output", choices=("dense", "sparse", "multi_vector", "m3"), default="dense",
                   help="what each row holds: the pooled embedding (default), sparse weights (SPLADE of a masked-LM "
                        "model, or BGE-M3's sparse head), ColBERT per-token vectors, or BGE-M3's three; the ragged "
                        "outputs need --out OUT.parquet; recorded in the manifest: --resume refuses to change it")
    p.add_argument("--top-k", type=int, default=None, metavar="K",
                   help="sparse / m3: keep at most K weights per row, largest first (recorded in the manifest)")
    p.set_defaults(func=main)


def main(args) -> int:
    import torch

    from fastenc import cli_checks
    from fastenc.corpus import embed
    from fastenc.corpus.job import EmbedInterrupted

    cli_checks.device(args.device)  # (the job checks its sizes itself, before any work)
    from fastenc.corpus.quantization import check_option

    if check_option(args.quantize, args.device, args.dtype) and args.engine == "ray" and args.gpus_per_actor:
        raise cli_checks.UsageError(f"--quantize {args.quantize} runs on the CPU, got --gpus-per-actor "
                                    f"{args.gpus_per_actor:g}")
    from fastenc.corpus.writers import WriteError

    inputs = args.inputs if len(args.inputs) > 1 else args.inputs[0]
    if isinstance(inputs, list):
        from pathlib import Path
        if "-" in inputs:
            print("fastenc embed: '-' (standard input) cannot be combined with other inputs", file=sys.stderr)
            return 2
        inputs = [Path(i) for i in inputs]
    kw = dict(out=args.out, pooling=args.pooling, normalize=args.normalize, max_length=args.max_length,
              max_batch_tokens=args.max_batch_tokens, max_batch_size=args.max_batch_size, window=args.window,
              text_field=args.text_field, id_field=args.id_field, on_bad=args.on_bad, device=args.device,
              dtype=getattr(torch, args.dtype) if args.dtype else None, overwrite=args.overwrite,
              progress=not args.no_progress, engine=args.engine, quantize=args.quantize,
              dimensions=args.dimensions, output=args.output, top_k=args.top_k)
    if args.engine == "ray":
        kw.update(address=args.address, actors=args.actors, gpus_per_actor=args.gpus_per_actor)
        if args.resume:
            print("fastenc embed: --resume is for the local engine (a Ray run restarts with --overwrite)",
                  file=sys.stderr)
            return 2
    else:
        kw["resume"] = args.resume
        kw["stdin_format"] = args.stdin_format
    try:
        summary = embed(inputs, args.model, **kw)
    except EmbedInterrupted as e:
        print(str(e), file=sys.stderr)
        return 130
    except WriteError as e:  # the output's disk or folder failed: complete shards are kept for --resume
        print(f"fastenc {e}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, FileNotFoundError, FileExistsError, PermissionError, ImportError) as e:
        print(f"fastenc embed: {e}" if not str(e).startswith("embed:") else f"fastenc {e}", file=sys.stderr)
        return 2
    print(summary.line())
    for src, row, why in summary.bad[:5]:
        print(f"  skipped row {row} of {src}: {why}")
    print(f"embed: wrote {args.out}")
    return 0
