"""`fastenc serve --engine ray --replicas 2`: the same routes and responses from two Ray Serve replicas (a local
Ray instance in the server's own process, which the test starts and stops)."""
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("ray.serve")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_replicas_serve_the_same_app(minilm_dir, tmp_path):
    import httpx

    import fastenc

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "fastenc", "serve", "--engine", "ray", "--replicas", "2",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"))
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "Ray Serve replicas not ready in time"
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        texts = [f"replica test sentence {i} " * (1 + i % 4) for i in range(24)]
        ref = fastenc.from_pretrained(minilm_dir).encode(texts, normalize=True).numpy()
        with httpx.Client(base_url=url, timeout=60) as c:
            rows = []
            for a in range(0, 24, 6):
                r = c.post("/embed", json={"inputs": texts[a:a + 6]})
                assert r.status_code == 200, r.text
                rows.extend(r.json())
            bad = c.post("/embed", json={"inputs": []})
            info = c.get("/info").json()
        got = np.array(rows)
        assert (got * ref).sum(1).min() >= 0.99999
        assert bad.status_code == 422 and bad.json()["error_type"] == "Validation"
        assert info["torch_threads"] == max(1, (os.cpu_count() or 1) // 2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
