"""`fastenc bench serve`: the HTTP server driven over loopback by a bounded asynchronous client, beside the same
texts through the in-process model (the overhead baseline) and, when installed, an Infinity server on the same
model and texts.

Each server runs in a child process. At each concurrency level C, C clients on keep-alive connections send
POST /v1/embeddings requests of K texts drawn with a fixed seed from docstring passages, until the level's
request count or time cap is reached; requests/s, texts/s and latency percentiles are measured, with errors by
status. The in-process baseline embeds the same texts with `fastenc.embed` (the corpus job's token-budget
batches); batch-1 latency (one 16-token text) alternates server requests with in-process `model.encode` calls.
An overload phase, on a second fastenc server with a small in-flight limit, sends 8x that limit for a fixed time
and records statuses, the accepted requests' latency and the server's resident memory before and after. Writes
serve.json and serve_latency.png.
"""
from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson

from fastenc.benchmark import options
from fastenc.benchmark.timing import percentile


class HTTPClient:
    """A minimal HTTP/1.1 keep-alive client (one connection): little CPU per request, so the client takes as
    little as possible from the server's cores."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("server closed the connection")
        status = int(status_line.split()[1])
        length, chunked, close = 0, False, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            k, v = k.strip().lower(), v.strip()
            if k == "content-length":
                length = int(v)
            elif k == "transfer-encoding" and "chunked" in v.lower():
                chunked = True
            elif k == "connection" and v.lower() == "close":
                close = True
        if chunked:
            parts = []
            while True:
                size = int((await self.reader.readline()).strip(), 16)
                if size == 0:
                    await self.reader.readline()
                    break
                parts.append(await self.reader.readexactly(size))
                await self.reader.readline()
            data = b"".join(parts)
        else:
            data = await self.reader.readexactly(length)
        if close:
            self.close()
        return status, data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = self.reader = None


async def drive(host: str, port: int, path: str, bodies: list[bytes], concurrency: int, max_requests: int,
                time_cap: float) -> dict:
    """C clients sending bodies (round robin) until max_requests are answered or time_cap passes."""
    clients = [HTTPClient(host, port) for _ in range(concurrency)]
    lat: list[float] = []
    statuses: dict[str, int] = {}
    sent = 0
    t_end = time.perf_counter() + time_cap

    async def worker(c: HTTPClient):
        nonlocal sent
        while sent < max_requests and time.perf_counter() < t_end:
            body = bodies[sent % len(bodies)]
            sent += 1
            t0 = time.perf_counter()
            try:
                status, _ = await c.post(path, body)
            except (ConnectionError, asyncio.IncompleteReadError, OSError) as e:
                statuses[type(e).__name__] = statuses.get(type(e).__name__, 0) + 1
                c.close()
                continue
            dt = time.perf_counter() - t0
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            if status == 200:
                lat.append(dt * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in clients))
    wall = time.perf_counter() - t0
    for c in clients:
        c.close()
    ok = len(lat)
    return {"concurrency": concurrency, "requests": sum(statuses.values()), "ok": ok, "seconds": wall,
            "statuses": statuses, "requests_per_s": ok / wall if wall else 0.0,
            "p50_ms": percentile(lat, 0.5), "p90_ms": percentile(lat, 0.9), "p99_ms": percentile(lat, 0.99)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(float(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
    except (OSError, StopIteration):
        return float("nan")


class Child:
    """A server in a child process: started, waited for (/health 200), stopped with SIGTERM."""

    def __init__(self, argv: list[str], port: int, log: Path, health: str = "/health", env: dict | None = None):
        self.port, self.health = port, health
        self.log = open(log, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float) -> None:
        import urllib.request
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode} (see {self.log.name})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{self.health}", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"the server on port {self.port} was not ready in {timeout:.0f} s")

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def _bodies(passages: list[str], k: int, n: int, seed: int, model: str) -> tuple[list[bytes], list[list[str]]]:
    rng = random.Random(seed)
    sets = [[rng.choice(passages) for _ in range(k)] for _ in range(n)]
    return [orjson.dumps({"model": model, "input": s, "encoding_format": "float"}) for s in sets], sets


def _check_embeddings(port: int, path: str, texts: list[str], model_name: str, ref: np.ndarray) -> float:
    """min cosine of the server's embeddings of texts against ref (one request)."""
    import urllib.request
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", orjson.dumps({"model": model_name,
                                 "input": texts}), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        got = np.array([d["embedding"] for d in orjson.loads(r.read())["data"]], dtype=np.float64)
    got /= np.linalg.norm(got, axis=1, keepdims=True)
    return float((got * ref / np.linalg.norm(ref, axis=1, keepdims=True)).sum(1).min())


def in_process(model, texts: list[str]) -> dict:
    """The in-process baseline of throughput: texts/s of fastenc.embed (the corpus job) over the texts."""
    import fastenc
    fastenc.embed(texts[:64], model)  # warm
    t0 = time.perf_counter()
    fastenc.embed(texts, model)
    return {"job_texts_per_s": len(texts) / (time.perf_counter() - t0)}


def paired_latency(model, text: str, host: str, port: int, path: str, body: bytes, rounds: int,
                   gap_s: float = 0.005) -> dict:
    """Batch-1 latency of the server beside the in-process model.encode of the same text, alternated call by
    call (with a short idle gap after each, so neither runs in the other's wake): p50/p90/p99 of both."""
    loop = asyncio.new_event_loop()
    client = HTTPClient(host, port)
    own, served = [], []
    try:
        for _ in range(10):  # warm both
            model.encode([text], normalize=True)
            loop.run_until_complete(client.post(path, body))
        for _ in range(rounds):
            t0 = time.perf_counter()
            model.encode([text], normalize=True)
            own.append((time.perf_counter() - t0) * 1000)
            time.sleep(gap_s)
            t0 = time.perf_counter()
            status, _ = loop.run_until_complete(client.post(path, body))
            if status == 200:
                served.append((time.perf_counter() - t0) * 1000)
            time.sleep(gap_s)
    finally:
        client.close()
        loop.close()
    q = {"p50_ms": 0.5, "p90_ms": 0.9, "p99_ms": 0.99}
    return {"rounds": rounds, "ok": len(served), **{k: percentile(served, v) for k, v in q.items()},
            **{f"in_process_{k}": percentile(own, v) for k, v in q.items()}}


def _levels(host, port, path, bodies, concurrencies, per_level, time_cap, k) -> list[dict]:
    rows = []
    for c in concurrencies:
        asyncio.run(drive(host, port, path, bodies[:max(c, 8)], c, min(c * 4, 64), 10))  # warm the connections
        r = asyncio.run(drive(host, port, path, bodies, c, per_level, time_cap))
        r["texts_per_s"] = r["requests_per_s"] * k
        rows.append(r)
        print(f"  c={c:<4} {r['requests_per_s']:8.1f} req/s {r['texts_per_s']:8.0f} texts/s  p50 {r['p50_ms']:7.2f} "
              f"p99 {r['p99_ms']:7.2f} ms  {r['statuses']}", flush=True)
    return rows


COMMAND = "serve"
HELP = "the HTTP server over loopback vs the in-process model and Infinity"


def add_arguments(p) -> None:
    p.add_argument("--model-dir", default=None, help="model folder (default: the embedded MiniLM)")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated client concurrencies")
    p.add_argument("--texts-per-request", type=int, default=8, help="texts in each request (default 8)")
    p.add_argument("--requests", type=int, default=400, help="requests per concurrency level (default 400)")
    p.add_argument("--time-cap", type=float, default=60.0, help="seconds at most per level (default 60)")
    p.add_argument("--overload-seconds", type=float, default=30.0,
                   help="seconds of 8x the in-flight limit (default 30; 0 for none)")
    p.add_argument("--infinity", default=None, help="path of the infinity_emb command (default: on PATH)")
    p.add_argument("--ray-replicas", type=int, default=0, help="also run N Ray Serve replicas (default 0)")


def command(args, device: str, dtype, out: Path) -> dict:
    from fastenc import cli_checks

    for flag in ("texts_per_request", "requests"):
        cli_checks.at_least(getattr(args, flag), 1, "--" + flag.replace("_", "-"))
    levels = options.ints(args.concurrency, ())
    if not levels:
        raise options.UsageError(f"--concurrency must list positive integers, got {args.concurrency!r}")
    return bench_serve(out, model_dir=args.model_dir, concurrencies=levels, texts_per_request=args.texts_per_request,
                       requests_per_level=args.requests, time_cap=args.time_cap,
                       overload_seconds=args.overload_seconds, infinity=args.infinity,
                       ray_replicas=args.ray_replicas, threads=args.threads, note=args.note)


def bench_serve(out: Path, *, model_dir=None, concurrencies=(1, 8, 32), texts_per_request: int = 8,
                requests_per_level: int = 400, time_cap: float = 60.0, overload_seconds: float = 30.0,
                infinity: str | None = None, ray_replicas: int = 0, threads: int | None = None,
                note: str | None = None) -> dict:
    import torch

    from fastenc.benchmark import report
    from fastenc.corpus.docstrings import docstring_passages
    from fastenc.corpus.job import default_model_path, load_model

    folder = Path(model_dir) if model_dir is not None else default_model_path()
    passages = list(docstring_passages(4000, max_chars=1000))
    name = "bench-model"
    bodies, sets = _bodies(passages, texts_per_request, 1000, 0, name)
    short_text = "how do I reset my password on the mobile app after changing my phone"  # 16 tokens (MiniLM)
    short_body = [orjson.dumps({"model": name, "input": short_text})]
    out.mkdir(parents=True, exist_ok=True)
    payload = {"suite": "serve", **report.metadata("cpu", torch.float32, False), "note": note,
               "model": str(folder), "texts_per_request": texts_per_request, "requests_per_level": requests_per_level,
               "providers": {}}
    thread_args = ["--threads", str(threads)] if threads else []

    print("in-process baseline", flush=True)
    model, _ = load_model(folder)  # kept: the latency phase pairs every request with an in-process call
    level_texts = [t for s in sets[:requests_per_level] for t in s]
    payload["in_process"] = in_process(model, level_texts)
    ref = model.encode(sets[0], normalize=True).numpy()
    print(f"  fastenc.embed {payload['in_process']['job_texts_per_s']:.0f} texts/s", flush=True)

    def run_provider(key, argv, port, path, health="/health", env=None, overload=False, limit=None):
        print(key, flush=True)
        child = Child(argv, port, out / f"serve-{key}.log", health, env)
        try:
            child.wait_ready(900)
            row = {"cosine_min": _check_embeddings(port, path, sets[0], name, ref)}
            if not overload:
                row["levels"] = _levels("127.0.0.1", port, path, bodies, concurrencies, requests_per_level,
                                        time_cap, texts_per_request)
            lat = paired_latency(model, short_text, "127.0.0.1", port, path, short_body[0], 300)
            row["latency_1x16"] = lat
            print(f"  1 x 16 tokens: p50 {lat['p50_ms']:.2f} p99 {lat['p99_ms']:.2f} ms; in-process encode beside "
                  f"it p50 {lat['in_process_p50_ms']:.2f} p99 {lat['in_process_p99_ms']:.2f} ms", flush=True)
            if overload and overload_seconds > 0:
                row["overload"] = _overload(child, port, path, bodies, limit, texts_per_request, overload_seconds)
        finally:
            row_rc = child.stop()
        row["exit_code"] = row_rc
        payload["providers"][key] = row

    limit = 8 * texts_per_request  # in-flight inputs: 8 requests of K texts; the overload phase sends 8x that
    port = _free_port()
    run_provider("fastenc", [sys.executable, "-m", "fastenc", "serve", str(folder), "--port", str(port),
                             "--served-model-name", name, "--max-concurrent-requests", str(limit * 8),
                             *thread_args], port, "/v1/embeddings")
    port = _free_port()
    run_provider("fastenc-limited", [sys.executable, "-m", "fastenc", "serve", str(folder), "--port", str(port),
                                     "--served-model-name", name, "--max-concurrent-requests", str(limit),
                                     *thread_args], port, "/v1/embeddings", overload=True, limit=limit)
    if ray_replicas:
        port = _free_port()
        run_provider(f"fastenc-ray-{ray_replicas}", [sys.executable, "-m", "fastenc", "serve", str(folder),
                                                     "--port", str(port), "--engine", "ray", "--replicas",
                                                     str(ray_replicas), "--served-model-name", name,
                                                     "--max-concurrent-requests", str(limit * 8)],
                     port, "/v1/embeddings", env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"))
    inf = infinity or shutil.which("infinity_emb")
    if inf and not (Path(inf).is_file() and os.access(inf, os.X_OK)):
        payload["providers"]["infinity"] = {"skipped": f"{inf} is not an executable file"}
    elif inf:
        port = _free_port()
        env = dict(os.environ, INFINITY_ANONYMOUS_USAGE_STATS="0", HF_HUB_OFFLINE="1")
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        run_provider("infinity", [inf, "v2", "--model-id", str(folder), "--served-model-name", name, "--host",
                                  "127.0.0.1", "--port", str(port), "--engine", "torch", "--device", "cpu",
                                  "--no-bettertransformer"],
                     port, "/embeddings", health="/health", env=env)
    else:
        payload["providers"]["infinity"] = {"skipped": "infinity_emb not found (pass --infinity PATH)"}
    payload["ratios"] = _ratios(payload, concurrencies)
    files = [report.write_json(out / "serve.json", payload)]
    png = _plot(payload, out / "serve_latency.png")
    if png:
        files.append(png)
    return {"files": files}


def _overload(child: Child, port: int, path: str, bodies, limit: int, k: int, seconds: float) -> dict:
    """8x the in-flight limit (in requests of k inputs) for `seconds`, after a tenth of that as warm-up: statuses,
    accepted p99, and the RSS from the end of the warm-up to the end."""
    conc = max(1, 8 * limit // k)
    warm = asyncio.run(drive("127.0.0.1", port, path, bodies, conc, 10 ** 9, max(2.0, seconds / 10)))
    rss0 = _rss_mib(child.proc.pid)  # after a tenth of the time at the same load: the allocator's pools are grown
    r = asyncio.run(drive("127.0.0.1", port, path, bodies, conc, 10 ** 9, seconds))
    r["rss_mib_before"], r["rss_mib_after"] = rss0, _rss_mib(child.proc.pid)
    r["warmup_requests"] = warm["requests"]
    r["concurrency_limit_inputs"] = limit
    print(f"  overload c={conc}: {r['requests']} requests {r['statuses']} accepted p99 {r['p99_ms']:.1f} ms, "
          f"RSS {rss0:.0f} -> {r['rss_mib_after']:.0f} MiB", flush=True)
    return r


def _ratios(payload: dict, concurrencies) -> dict:
    p, base = payload["providers"], payload["in_process"]
    out = {}
    fe = p.get("fastenc", {}).get("levels")
    if not fe:
        return out
    top = max(concurrencies)
    fe_top = next(r for r in fe if r["concurrency"] == top)
    out[f"fastenc_c{top}_vs_in_process_job"] = fe_top["texts_per_s"] / base["job_texts_per_s"]
    lat = p["fastenc"]["latency_1x16"]
    out["fastenc_1x16_p50_minus_in_process_ms"] = lat["p50_ms"] - lat["in_process_p50_ms"]
    out["fastenc_1x16_p99_over_p50"] = lat["p99_ms"] / lat["p50_ms"]
    out["in_process_1x16_p99_over_p50"] = lat["in_process_p99_ms"] / lat["in_process_p50_ms"]
    over = p.get("fastenc-limited", {}).get("overload")
    if over and fe:
        knee = max(fe, key=lambda r: r["texts_per_s"])  # the level of the best throughput
        out["overload_accepted_p99_over_knee_p99"] = over["p99_ms"] / knee["p99_ms"]
        out["overload_rss_drift"] = over["rss_mib_after"] / over["rss_mib_before"] - 1
    for key, row in p.items():
        if key != "fastenc" and row.get("levels"):
            other = next(r for r in row["levels"] if r["concurrency"] == top)
            out[f"fastenc_c{top}_vs_{key}"] = fe_top["texts_per_s"] / other["texts_per_s"]
    return out


def _plot(payload: dict, path: Path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, row in payload["providers"].items():
        levels = row.get("levels")
        if not levels:
            continue
        ax.plot([r["texts_per_s"] for r in levels], [r["p50_ms"] for r in levels], "o-", label=f"{key} p50")
        ax.plot([r["texts_per_s"] for r in levels], [r["p99_ms"] for r in levels], "x--", label=f"{key} p99")
        for r in levels:
            ax.annotate(f"c={r['concurrency']}", (r["texts_per_s"], r["p50_ms"]), fontsize=7)
    ax.axvline(payload["in_process"]["job_texts_per_s"], color="gray", ls=":", label="in-process job")
    ax.set_xlabel("texts/s")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.set_title(f"fastenc serve, {payload['texts_per_request']} texts per request ({payload['machine']['cpu']})",
                 fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

