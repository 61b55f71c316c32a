"""`fastenc serve --engine ray`: the same app on Ray Serve, N replicas each holding the model (loaded and warmed in
the replica's constructor) behind Ray Serve's HTTP proxy; same routes and responses. Each replica takes an equal
share of the machine's cores as its torch threads unless --threads says otherwise."""
from __future__ import annotations

import os
import signal
import sys
import threading

from ray import serve


@serve.ingress()
class FastencReplica:
    def __init__(self, model_dir, limits: dict, device=None, threads: int | None = None):
        import torch

        from fastenc.serve.service import Service
        from fastenc.serve.settings import Limits

        if threads:
            torch.set_num_threads(threads)
        self.service = Service(model_dir, Limits.make(**limits), device).load()

    def __serve_build_asgi_app__(self):
        from fastenc.serve.app import create_app
        return create_app(service=self.service)


def run(model_dir, limits: dict, *, replicas: int, address: str | None, host: str, port: int, device=None,
        threads: int | None = None) -> int:
    """Start Ray (or join `address`), deploy `replicas` replicas on host:port, serve until SIGTERM / SIGINT, then
    shut Serve down and return 0."""
    import ray

    cores = os.cpu_count() or 1
    per_replica = threads or max(1, cores // replicas)
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 **({} if address else {"num_cpus": max(cores, replicas * per_replica)}))
    stop = threading.Event()  # (handlers set before the app can answer: a SIGTERM from then on drains)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve.start(http_options={"host": host, "port": port})
    deployment = serve.deployment(FastencReplica, name="fastenc", num_replicas=replicas,
                                  max_ongoing_requests=max(8, int(limits.get("max_concurrent_requests") or 512)),
                                  ray_actor_options={"num_cpus": per_replica})
    serve.run(deployment.bind(None if model_dir is None else str(model_dir), limits, device, per_replica),
              name="fastenc", route_prefix="/")
    print(f"fastenc serve: {replicas} Ray Serve replica(s) on http://{host}:{port}", file=sys.stderr, flush=True)
    stop.wait()
    serve.shutdown()
    ray.shutdown()
    return 0
