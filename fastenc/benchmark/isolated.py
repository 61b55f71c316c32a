"""One model of `fastenc bench models` in its own process: `python -m fastenc.benchmark.isolated '<json spec>'`.

Runs fastenc.benchmark.models.run_model and reports its steps, logs and result to the parent as JSON lines on
the original stdout; anything else the libraries print goes to stderr.
"""
from __future__ import annotations

import json
import os
import sys


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

        from fastenc.benchmark import models

        torch.set_num_threads(spec["threads"])
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
