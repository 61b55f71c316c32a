"""`fastenc serve` as a process: bad arguments are one line and exit 2 before any load; SIGTERM drains (503 for
new requests, the running ones answered) and exits 0."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest


@pytest.mark.parametrize("argv,words", [
    (["--port", "70000"], "--port must be in [0, 65535]"),
    (["--threads", "0"], "--threads"),
    (["--device", "bogus"], "--device"),
    (["--max-batch-tokens", "0"], "max_batch_tokens must be a positive int"),
    (["--max-wait-ms", "-1"], "max_wait_ms"),
    (["--replicas", "2"], "need --engine ray"),
    (["/nonexistent/model"], "is not a model folder"),
    (["--quantize", "int4"], "--quantize must be one of int8 (or left out for fp32), got 'int4'"),
    (["--quantize", "int8", "--device", "bogus"], "--device"),
])
def test_bad_arguments(capsys, argv, words):
    from fastenc import cli
    rc = cli.main(["serve", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and words in err and len(err.strip().splitlines()) == 1, err


def in_server(url: str) -> int:
    """Inputs the server holds permits for, read from /metrics."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=5).text
    m = re.search(r"^fastenc_in_flight_inputs (\S+)$", text, re.M)
    assert m, text
    return int(float(m.group(1)))


def test_sigterm_drains_and_exits_0(tmp_path):
    import httpx

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "fastenc", "serve", "--port", "0", "--graceful-timeout", "20"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stderr.readline()
        m = re.search(r"listening on (http://\S+)", line)
        assert m, line
        url = m.group(1)
        deadline = time.monotonic() + 600
        while httpx.get(url + "/health", timeout=5).status_code != 200:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        state = proc  # the running requests: long enough to be in flight when SIGTERM arrives
        results = []

        def post():
            try:
                results.append(httpx.post(url + "/embed", json={"inputs": ["drain me " * 200] * 32},
                                          timeout=120).status_code)
            except httpx.HTTPError as e:
                results.append(repr(e))

        threads = [threading.Thread(target=post) for _ in range(4)]
        for t in threads:
            t.start()
        # SIGTERM only once every request is in the server (its inputs hold permits) or answered: a request
        # still on its way when the listener closes is refused at the socket, which is not what this tests
        while in_server(url) // 32 + len(results) < 4:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        state.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
        assert proc.wait(60) == 0
        assert results == [200] * 4, results
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
