"""`fastenc serve [MODEL_DIR]`: one model folder over HTTP (uvicorn), or `--engine ray --replicas N` on Ray Serve.
Arguments are checked before the model loads; SIGTERM / SIGINT drain (503 for new requests, in-flight and queued
work finished up to --graceful-timeout) and exit 0."""
from __future__ import annotations

import sys
from pathlib import Path


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve a model folder over HTTP (TEI, OpenAI and Cohere routes)")
    p.add_argument("model_dir", nargs="?", default=None,
                   help="model folder (default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0 picks a free port (printed)")
    p.add_argument("--device", default=None, help="cpu (default) or cuda[:N]")
    p.add_argument("--threads", type=int, default=None, help="torch threads of the model (default: torch's)")
    p.add_argument("--max-batch-tokens", type=int, default=16384, help="real tokens one forward packs")
    p.add_argument("--max-batch-requests", type=int, default=None, help="inputs one forward takes")
    p.add_argument("--max-concurrent-requests", type=int, default=512, help="inputs in flight; over it 429")
    p.add_argument("--max-client-batch-size", type=int, default=32, help="inputs in one request; over it 413")
    p.add_argument("--payload-limit", type=int, default=2_000_000, help="request body bytes; over it 413")
    p.add_argument("--max-wait-ms", type=float, default=None, help="wait this long for a fuller batch")
    p.add_argument("--no-auto-truncate", dest="auto_truncate", action="store_false",
                   help="refuse (413) inputs over the maximum length unless the request asks to truncate")
    p.add_argument("--max-input-length", type=int, default=None, help="tokens (default: the model's)")
    p.add_argument("--graceful-timeout", type=float, default=30.0, help="seconds SIGTERM waits for work")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (or FASTENC_API_KEY)")
    p.add_argument("--served-model-name", default=None, help="the model name requests may give")
    p.add_argument("--tokenization-workers", type=int, default=1)
    p.add_argument("--quantize", default=None, metavar="int8",
                   help="run the model int8 (fastenc.quantize after it loads, in each Ray replica; CPU only)")
    p.add_argument("--engine", choices=("uvicorn", "ray"), default="uvicorn")
    p.add_argument("--replicas", type=int, default=1, help="Ray Serve replicas (--engine ray)")
    p.add_argument("--address", default=None, help="Ray cluster address (--engine ray; default: a local one)")
    p.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=main)


LIMIT_ARGS = ("max_batch_tokens", "max_batch_requests", "max_concurrent_requests", "max_client_batch_size",
              "payload_limit", "max_wait_ms", "auto_truncate", "max_input_length", "graceful_timeout", "api_key",
              "served_model_name", "tokenization_workers", "quantize")


def check_args(args) -> str | None:
    """The first reason the arguments cannot work, else None (nothing loaded yet)."""
    from fastenc import cli_checks
    from fastenc.corpus.quantization import check_option

    try:
        check_option(args.quantize)  # (its value first: Limits would name it without the dashes)
    except cli_checks.UsageError as e:
        return f"serve: {e}"
    try:
        from fastenc.serve.settings import Limits
        Limits.make(**{k: getattr(args, k) for k in LIMIT_ARGS})
    except (TypeError, ValueError) as e:
        return str(e)
    if not 0 <= args.port <= 65535:
        return f"serve: --port must be in [0, 65535], got {args.port}"
    if args.replicas < 1:
        return f"serve: --replicas must be >= 1, got {args.replicas}"
    if args.engine != "ray" and (args.replicas != 1 or args.address is not None):
        return "serve: --replicas and --address need --engine ray"
    if args.model_dir is not None and not (Path(args.model_dir) / "config.json").is_file():
        return f"serve: {args.model_dir!r} is not a model folder (no config.json)"
    try:
        cli_checks.threads(args.threads)
        cli_checks.device(args.device)
        check_option(args.quantize, args.device)
    except cli_checks.UsageError as e:
        return f"serve: {e}"
    try:
        import fastapi, orjson, prometheus_client, uvicorn  # noqa: F401,E401
    except ImportError as e:
        return f"serve: {e.name} is not installed: pip install 'fastenc[serve]'"
    if args.engine == "ray":
        try:
            import ray.serve  # noqa: F401
        except ImportError:
            return "serve: --engine ray needs Ray Serve: pip install 'fastenc[serve]' 'ray[serve]'"
    return None


def main(args) -> int:
    why = check_args(args)
    if why:
        print(f"fastenc: {why}", file=sys.stderr)
        return 2
    limits = {k: getattr(args, k) for k in LIMIT_ARGS}
    if args.engine == "ray":
        from fastenc.serve.ray_app import run
        return run(args.model_dir, limits, replicas=args.replicas, address=args.address, host=args.host,
                   port=args.port, device=args.device, threads=args.threads)
    return run_uvicorn(args.model_dir, limits, host=args.host, port=args.port, device=args.device,
                       threads=args.threads, log_level=args.log_level)


def run_uvicorn(model_dir, limits: dict, *, host: str, port: int, device=None, threads=None,
                log_level: str = "warning") -> int:
    import torch
    import uvicorn

    from fastenc.serve.app import create_app

    if threads is not None:
        torch.set_num_threads(threads)
    app = create_app(model_dir, device=device, **limits)
    state = app.state.fastenc
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=max(1, int(limits.get("graceful_timeout") or 30)))

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame):
            state.drain()  # new requests get 503 while uvicorn lets the running ones finish
            super().handle_exit(sig, frame)
            # uvicorn re-raises a captured signal once shut down (the process then dies by it); a drained
            # shutdown asked for by SIGTERM / SIGINT is a normal exit here
            getattr(self, "_captured_signals", []).clear()

    try:
        sock = config.bind_socket()
    except (OSError, SystemExit) as e:
        print(f"fastenc: serve: cannot listen on {host}:{port}: {e}", file=sys.stderr)
        return 2
    print(f"fastenc serve: listening on http://{host}:{sock.getsockname()[1]}", file=sys.stderr, flush=True)
    DrainingServer(config).run(sockets=[sock])
    return 0 if state.error is None else 1
