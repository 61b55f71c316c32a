"""One model of `fastenc bench models` or `fastenc bench train` in its own process:
`python -m fastenc.benchmark.isolated '<json spec>'` (the parent calls `run(spec, ...)`).

Runs the spec's "entry" ("module:function", e.g. fastenc.benchmark.models:run_isolated), called as
function(spec, send) with send(kind, payload) for "step", "tick" and "log" messages, and reports its steps, logs
and result to the parent as JSON lines on the original stdout (the entry is imported by name, so this module
imports none of the suites that run through it); anything else the libraries print goes to stderr. A fresh process per
model keeps a model's timing and memory from depending on what an earlier model left behind: after larger
allocations glibc's adaptive mmap/trim thresholds let later large buffers come from the heap without page faults,
and buffers, thread pools or ONNX Runtime sessions linger.
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from typing import Callable


class ChildFailed(RuntimeError):
    """The process of a spec ended without a result: `code` its exit status (negative: -signal), `killed` whether a
    signal ended it (SIGKILL from the kernel's out-of-memory killer, most often), `error` the child's own message."""

    def __init__(self, model, code: int, error: str | None):
        self.code, self.error, self.killed = code, error, code < 0
        how = f"exit code {code}"
        if code < 0:
            import signal

            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            how = f"killed by {name}" + (" (the system ran out of memory, most likely)" if -code == 9 else "")
        super().__init__(f"{model}: benchmark process failed ({how})" + (f": {error}" if error else ""))


def run(spec: dict, log: Callable[[str], None], tick: Callable[[], None], step: Callable[[str], None]):
    """Run `spec` in a fresh Python process; its log lines, progress ticks and steps go to the callbacks; returns
    its result (JSON), or raises ChildFailed (a RuntimeError) with the child's error or the signal that ended it."""
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
        raise ChildFailed(spec.get("model"), code, error)
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
        module, _, func = spec["entry"].partition(":")
        send("done", getattr(importlib.import_module(module), func)(spec, send))
        return 0
    except BaseException as e:  # noqa: BLE001  (the parent raises with this message)
        send("error", f"{type(e).__name__}: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
