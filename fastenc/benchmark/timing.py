"""Timers for the benchmarks: a monotonic-clock timer on CPU, CUDA events on GPU, and an interleaved (ABAB)
runner so that providers measured on a shared, noisy machine see the same conditions.

CPU: time.perf_counter_ns around each call (after warm-up), one sample per call.
GPU: a pair of torch.cuda.Event per call, recorded around the call on the current stream, synchronized once
after all calls of a round (event timing excludes launch gaps between rounds, not inside a call).
Statistics: median and the 0.2/0.8 quantiles (the ones Triton's do_bench reports), min, mean, count.
"""
from __future__ import annotations

import statistics
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Mapping

import torch

QUANTILES = (0.2, 0.5, 0.8)


@dataclass
class Stats:
    """Times of repeated calls, in milliseconds."""

    median_ms: float
    q20_ms: float
    q80_ms: float
    min_ms: float
    mean_ms: float
    n: int

    def as_dict(self) -> dict:
        return asdict(self)


def _quantile(sorted_x: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted list (numpy's default 'linear' method)."""
    if not sorted_x:
        return float("nan")
    pos = q * (len(sorted_x) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_x) - 1)
    return sorted_x[lo] + (sorted_x[hi] - sorted_x[lo]) * (pos - lo)


def summarize(samples_ms: list[float]) -> Stats:
    s = sorted(samples_ms)
    if not s:
        nan = float("nan")
        return Stats(nan, nan, nan, nan, nan, 0)
    return Stats(median_ms=_quantile(s, 0.5), q20_ms=_quantile(s, 0.2), q80_ms=_quantile(s, 0.8), min_ms=s[0],
                 mean_ms=statistics.fmean(s), n=len(s))


def percentile(samples_ms: list[float], q: float) -> float:
    return _quantile(sorted(samples_ms), q)


def sync(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _time_call_cpu(fn: Callable[[], object], clock: Callable[[], float] | None = None) -> float:
    if clock is not None:
        t0 = clock()
        fn()
        return (clock() - t0) * 1e3
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) / 1e6


def interleaved(fns: Mapping[str, Callable[[], object]], device: str = "cpu", warmup: int = 1, repeats: int = 5,
                min_time_s: float = 0.0, max_repeats: int | None = None,
                on_round: Callable[[], None] | None = None, flush_l2: bool = False,
                clock: Callable[[], float] | None = None) -> dict[str, list[float]]:
    """Time every callable in `fns` round-robin (A B C A B C ...), returning name -> samples in ms.

    warmup:     untimed rounds first (compilation, caches, allocator).
    repeats:    timed rounds; more rounds are added until `min_time_s` of total timed work has passed,
                up to `max_repeats` (so microsecond kernels get enough samples and second-long models do not).
    The order inside a round rotates each round so no provider always runs right after the same one.
    flush_l2:   on CUDA, overwrite a 256 MiB buffer before each timed call (outside the events) so a kernel
                does not find its inputs in L2 from the previous call (as Triton's do_bench does).
    clock:      on the CPU, a clock in seconds to time each call with instead of the wall clock (e.g.
                time.thread_time: the calling thread's CPU time, little moved by other load on the machine).
    """
    names = list(fns)
    dev = torch.device(device)
    for _ in range(warmup):
        for n in names:
            fns[n]()
        sync(dev)
    samples: dict[str, list[float]] = {n: [] for n in names}
    scratch = torch.empty(64 * 2**20, dtype=torch.int32, device=dev) if flush_l2 and dev.type == "cuda" else None
    max_repeats = max(repeats, max_repeats or repeats)
    spent = 0.0
    r = 0
    while r < repeats or (spent < min_time_s and r < max_repeats):
        order = names[r % len(names):] + names[:r % len(names)] if names else []
        if dev.type == "cuda":
            events = []
            for n in order:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                if scratch is not None:
                    scratch.zero_()
                start.record()
                fns[n]()
                end.record()
                events.append((n, start, end))
            torch.cuda.synchronize()
            for n, start, end in events:
                ms = start.elapsed_time(end)
                samples[n].append(ms)
                spent += ms / 1e3
        else:
            for n in order:
                ms = _time_call_cpu(fns[n], clock)
                samples[n].append(ms)
                spent += ms / 1e3
        r += 1
        if on_round is not None:
            on_round()
    return samples


def time_fn(fn: Callable[[], object], device: str = "cpu", warmup: int = 1, repeats: int = 5,
            min_time_s: float = 0.0, max_repeats: int | None = None) -> Stats:
    """Time one callable (see `interleaved`)."""
    return summarize(interleaved({"fn": fn}, device, warmup, repeats, min_time_s, max_repeats)["fn"])


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _page_size()
    except OSError:
        return 0


_PAGE = []


def _malloc_trim() -> None:
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _page_size() -> int:
    if not _PAGE:
        import os
        try:
            _PAGE.append(os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            _PAGE.append(4096)
    return _PAGE[0]


def peak_memory(fn: Callable[[], object], device: str = "cpu") -> tuple[float, str]:
    """Extra memory one call needs above what was held before it, in MiB, and how it was measured.

    CUDA: torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus memory_allocated before.
    CPU:  resident set size (/proc/self/statm) sampled every millisecond by a thread during the call, peak
          minus the value before (covers allocations by any library in the process, e.g. ONNX Runtime); freed
          heap memory is first returned to the system (glibc malloc_trim), and fastenc's CPU buffer cache is
          emptied, so buffers kept from earlier calls do not hide what the call needs.
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20, "cuda max_memory_allocated"
    from fastenc import extension

    extension.empty_cache()
    _malloc_trim()
    before = _rss_bytes()
    if before == 0:
        fn()
        return float("nan"), "unavailable (no /proc/self/statm)"
    peak = [before]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            stop.wait(0.001)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        fn()
    finally:
        stop.set()
        th.join()
    peak[0] = max(peak[0], _rss_bytes())
    return (peak[0] - before) / 2**20, "rss sampled at 1 ms"
