"""Whole-model A/B of the panel GEMM's row rule, in one process, interleaved round by round: `new` (fastenc's panel
GEMM at every row count, prepack.use_panels) vs `old` (the panels up to 128 rows only, oneDNN's packed or the plain
GEMM above, the rule before f07cd1c), beside transformers sdpa. Prints medians (ms) and paired ratios, median
[20%, 80%].

  PYTHONPATH=. python bench/panel_rule_ab.py bert-base fixed,varlen 9
"""
import copy
import statistics
import sys
import time

import torch

from fastenc.benchmark import models as M
from fastenc.layers import prepack

OLD_PANEL_ROWS = 128  # rows up to which the old rule took the panel GEMM


def paired(samples: dict, a: str, b: str) -> str:
    """Median [20%, 80%] of the per-round ratios samples[a] / samples[b]."""
    q = sorted(x / y for x, y in zip(samples[a], samples[b]))
    return "%.3f [%.3f, %.3f]" % (statistics.median(q), q[len(q) // 5], q[-1 - len(q) // 5])


def main() -> None:
    name, workloads, rounds = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
    torch.set_num_threads(2)
    spec = M.MODELS[name]
    hf = spec.build().eval()
    vocab = getattr(hf.config, "vocab_size", 0)
    fe = M._torch_fn(M.fastenc_model(copy.deepcopy(hf)).eval())
    hs = M._torch_fn(copy.deepcopy(hf).eval())
    rule_new = prepack.use_panels

    def rule_old(x, w):
        return rule_new(x, w) and x.shape[0] <= OLD_PANEL_ROWS

    def with_rule(rule):
        def run(inputs):
            prepack.use_panels = rule
            return fe(inputs)
        return run

    fns = {"new": with_rule(rule_new), "old": with_rule(rule_old), "hf": hs}
    for wl in workloads:
        inputs = M.workloads(spec, vocab)[wl][0]
        for f in fns.values():
            f(inputs)
        samples = {k: [] for k in fns}
        for _ in range(rounds):
            for k, f in fns.items():
                t0 = time.perf_counter()
                f(inputs)
                samples[k].append(time.perf_counter() - t0)
        med = {k: round(statistics.median(v) * 1e3, 1) for k, v in samples.items()}
        print(name, wl, med, "hf/new", paired(samples, "hf", "new"), "hf/old", paired(samples, "hf", "old"),
              "old/new", paired(samples, "old", "new"), flush=True)
    prepack.use_panels = rule_new


if __name__ == "__main__":
    main()
