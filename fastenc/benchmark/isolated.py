"""One model of `fastenc bench models` or `fastenc bench train` in its own process:
`python -m fastenc.benchmark.isolated '<json spec>'` (the parent calls `run(spec, ...)`).

Runs fastenc.benchmark.models.run_model (spec without "suite", or "suite": "models") or, for "suite": "train",
fastenc.benchmark.train.run_case for each of the spec's modes, and reports its steps, logs and result to the
parent as JSON lines on the original stdout; anything else the libraries print goes to stderr. A fresh process per
model keeps a model's timing and memory from depending on what an earlier model left behind: after larger
allocations glibc's adaptive mmap/trim thresholds let later large buffers come from the heap without page faults,
and buffers, thread pools or ONNX Runtime sessions linger.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Callable


def run(spec: dict, log: Callable[[str], None], tick: Callable[[], None], step: Callable[[str], None]):
    """Run `spec` in a fresh Python process; its log lines, progress ticks and steps go to the callbacks; returns
    its result (JSON), or raises RuntimeError with the child's error."""
    proc = subprocess.Popen([sys.executable, "-m", "fastenc.benchmark.isolated", json.dumps(spec)],
                            stdout=subprocess.PIPE, text=True)
    result, error = None, None
    try:
        for line in proc.stdout:
            msg = json.loads(line)
            kind, payload = msg["kind"], msg.get("payload")
            if kind == "step":
                step(payload)
            elif kind == "tick":
                tick()
            elif kind == "log":
                log(payload)
            elif kind == "error":
                error = payload
            elif kind == "done":
                result = payload
    finally:
        code = proc.wait()
    if result is None:
        raise RuntimeError(f"{spec.get('model')}: benchmark process failed (exit code {code})"
                           + (f": {error}" if error else ""))
    return result


def main(argv: list[str]) -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints of the libraries go to stderr, not into the protocol
    sys.stdout = sys.stderr

    def send(kind: str, payload=None) -> None:
        proto.write(json.dumps({"kind": kind, "payload": payload}) + "\n")
        proto.flush()

    try:
        spec = json.loads(argv[0])
        import torch

        torch.set_num_threads(spec["threads"])
        if spec.get("suite") == "train":
            from fastenc.benchmark import train

            res = [train.run_case(spec["model"], mode, spec["providers"], quick=spec["quick"],
                                  repeats=spec["repeats"], log=lambda m: send("log", m), tick=lambda: send("tick"),
                                  attention_dropout=spec["attention_dropout"], workloads=spec["workloads"],
                                  optimizer=spec["optimizer"], breakdown=spec["breakdown"])
                   for mode in spec["modes"]]
            send("done", res)
            return 0
        from fastenc.benchmark import models

        res = models.run_model(models.MODELS[spec["model"]], spec["device"], getattr(torch, spec["dtype"]),
                               spec["providers"], quick=spec["quick"], threads=spec["threads"],
                               log=lambda m: send("log", m), tick=lambda: send("tick"), step=lambda m: send("step", m),
                               breakdown=spec.get("breakdown", False), only=spec.get("only"), rounds=spec.get("rounds"))
        send("done", res)
        return 0
    except BaseException as e:  # noqa: BLE001  (the parent raises with this message)
        send("error", f"{type(e).__name__}: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
