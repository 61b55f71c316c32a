"""AdamW step time on the CPU by implementation, for a parameter set shaped like a model's (one process,
interleaved round by round): torch.optim.AdamW(fused=True) (transformers Trainer's default, adamw_torch_fused),
foreach=True, and torch's CPU default (a loop of elementwise ops per parameter, adamw_torch), on random gradients.
Prints the median step time of each and its ratio to the fused one.

  PYTHONPATH=. python bench/adamw_step.py modernbert-base 7
"""
import statistics
import sys
import time

import torch

from fastenc.benchmark import train as T

KINDS = {"fused": dict(fused=True), "foreach": dict(foreach=True), "for-loop": dict(foreach=False)}


def main() -> None:
    name, rounds = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(2)
    shapes = [p.shape for p in T.build_hf(name, False).parameters()]
    opts = {}
    for kind, kw in KINDS.items():
        ps = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
        for p in ps:
            p.grad = torch.randn_like(p)
        opts[kind] = torch.optim.AdamW(ps, lr=1e-4, **kw)
        opts[kind].step()  # (state allocated outside the timing)
    times = {k: [] for k in KINDS}
    for r in range(rounds):
        for kind in list(KINDS)[r % 3:] + list(KINDS)[:r % 3]:
            t = time.perf_counter()
            opts[kind].step()
            times[kind].append(time.perf_counter() - t)
    n = sum(s.numel() for s in shapes)
    print(f"{name}: {n / 1e6:.1f}M parameters, {torch.get_num_threads()} threads, {rounds} rounds")
    fused = statistics.median(times["fused"])
    for kind in KINDS:
        m = statistics.median(times[kind])
        print(f"  {kind:9s} {m * 1e3:8.1f} ms  ({m / fused:.1f}x fused)")


if __name__ == "__main__":
    main()
