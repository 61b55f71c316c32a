"""Small-input cost of the C++/OpenMP CPU kernels: each op timed with 2 threads and with 1 thread, interleaved in
one process, per call wall time and process CPU time (all threads); prints medians of the paired 2T/1T ratios
with their quartiles, and BERT-base 1 x 16 forward wall time under inference_mode.

    python bench/omp_threshold.py [--reps 200] [--json out.json]
"""
import argparse
import json
import os
import statistics
import time

import torch

import fastenc


def _time(fn, threads, calls):
    torch.set_num_threads(threads)
    fn()
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - w0) / calls, (time.process_time() - c0) / calls


def _paired(fn, reps, calls):
    """Per rep: (2T wall, 1T wall, 2T cpu, 1T cpu), the two thread counts alternating in order."""
    rows = []
    for i in range(reps):
        order = (2, 1) if i % 2 == 0 else (1, 2)
        got = {t: _time(fn, t, calls) for t in order}
        rows.append((got[2][0], got[1][0], got[2][1], got[1][1]))
    return rows


def _summary(rows):
    def q(v):
        s = statistics.quantiles(v, n=4)
        return {"median": statistics.median(v), "q1": s[0], "q3": s[2]}
    return {
        "wall_2t_us": statistics.median(r[0] for r in rows) * 1e6,
        "wall_1t_us": statistics.median(r[1] for r in rows) * 1e6,
        "cpu_2t_us": statistics.median(r[2] for r in rows) * 1e6,
        "cpu_1t_us": statistics.median(r[3] for r in rows) * 1e6,
        "wall_ratio_2t_over_1t": q([r[0] / r[1] for r in rows]),
        "cpu_ratio_2t_over_1t": q([r[2] / max(r[3], 1e-9) for r in rows]),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    res = {"load": os.getloadavg(), "ops": {}}
    for rows_, n in [(16, 768), (4096, 768)]:
        x, r = torch.randn(rows_, n), torch.randn(rows_, n)
        w, b = torch.randn(n), torch.randn(n)
        fn = lambda: fastenc.ops.layer_norm(x, w, b, residual=r, backend="cpu")  # noqa: E731
        res["ops"][f"layer_norm+residual {rows_}x{n}"] = _summary(_paired(fn, args.reps, 200 if rows_ < 100 else 5))
    for rows_, n in [(16, 3072), (4096, 3072)]:
        x, b = torch.randn(rows_, n), torch.randn(n)
        fn = lambda: fastenc.ops.gelu(x, b, backend="cpu")  # noqa: E731
        res["ops"][f"gelu+bias {rows_}x{n}"] = _summary(_paired(fn, args.reps, 200 if rows_ < 100 else 3))
    import transformers

    model = fastenc.from_hf(transformers.BertModel(transformers.BertConfig()).eval()).eval()
    ids = torch.randint(0, 30000, (1, 16))
    mask = torch.ones(1, 16, dtype=torch.long)

    def fwd():
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask)
    res["ops"]["bert-base 1x16 forward"] = _summary(_paired(fwd, max(args.reps // 2, 5), 5))
    res["load_after"] = os.getloadavg()
    for k, v in res["ops"].items():
        wr, cr = v["wall_ratio_2t_over_1t"], v["cpu_ratio_2t_over_1t"]
        print(f"{k:32s} wall 2T {v['wall_2t_us']:9.1f} us  1T {v['wall_1t_us']:9.1f} us  2T/1T "
              f"{wr['median']:.2f} [{wr['q1']:.2f}, {wr['q3']:.2f}]   cpu 2T {v['cpu_2t_us']:9.1f} us  1T "
              f"{v['cpu_1t_us']:9.1f} us  2T/1T {cr['median']:.2f} [{cr['q1']:.2f}, {cr['q3']:.2f}]")
    print("load", res["load"], "->", res["load_after"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
