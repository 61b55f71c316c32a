"""The corpus job's memory stays flat as the corpus grows: glibc's mmap threshold is pinned once, at job start,
and each window starts from the same memory state (release_between_windows).

glibc serves a block of at least M_MMAP_THRESHOLD bytes (128 KiB at start) with its own mmap, returned to the system
on free. By default the threshold is dynamic: freeing an mmapped block raises it to that block's size (up to 32 MiB
on 64-bit), so afterwards blocks of that size come from the heap instead. The job frees and allocates activation
buffers of a different size for every batch (token-budget batches vary in rows and width), so those heap blocks
fragment the heap, and the process's peak grew with the number of batches: 1,304 MiB at 10,000 passages against
2,144 MiB at 40,000. Setting the threshold with mallopt fixes it and turns the dynamic adjustment off (glibc's
mallopt(3); the same as MALLOC_MMAP_THRESHOLD_ in the environment): the 40,000-passage job then peaked at 1,172 MiB.

The value is glibc's own starting threshold, 128 KiB: the job behaves as glibc does before its first large free, for
the whole run. Small allocations (tokenizer, Python objects) stay in the heap; a large buffer costs an mmap and its
page faults, which the repeated large buffers of the model's layers avoid through the CPU buffer cache
(csrc/cpu/buffer_cache.h). The setting is process-wide and stays after the job, as the environment variable would.

The GEMMs of fastenc.layers.Linear run on fastenc's own packed panels (fastenc/layers/prepack.py, csrc/cpu/gemm.cpp),
which keep no state per row count. oneDNN's packed GEMM, which a call takes only while fastenc's extension is not
loaded, does keep state for every distinct row count it has multiplied (prepack.packed_rows bounds how many), and a
job's batches (unpadded tokens) have a new row count almost every time. Before the panels served every row count,
MiniLM forwards of one row at 64 to 463 distinct token counts in a fresh process (one
thread, mmap threshold pinned, the release run every 50 or 100 calls) grew its RSS by about 1.1 MiB per new count up
to ~300 counts and 0.7 MiB per count after; 0.7 MiB per count from the start with ONEDNN_PRIMITIVE_CACHE_CAPACITY=0;
with FASTENC_PREPACK=0 (threshold not pinned) 11 MiB over 150 counts after the first 50.
"""
from __future__ import annotations

import ctypes
import logging
import sys

M_MMAP_THRESHOLD = -3          # mallopt's parameter number in glibc's <malloc.h>
MMAP_THRESHOLD = 128 * 1024    # bytes: glibc's default starting threshold (DEFAULT_MMAP_THRESHOLD_MIN)

_log = logging.getLogger(__name__)
_state = {"done": False, "pinned": False}


def _glibc():
    """The process's C library if it is glibc (mallopt's parameter number -3 and malloc_trim are glibc's), else
    None (not Linux, or it cannot be opened)."""
    if not sys.platform.startswith("linux"):
        return None
    for name in (None, "libc.so.6"):
        try:
            libc = ctypes.CDLL(name)
            libc.gnu_get_libc_version  # glibc only
            return libc
        except (OSError, AttributeError):
            continue
    return None


def _glibc_function(name: str, argtypes: list, restype=ctypes.c_int):
    """glibc's function `name` as a typed ctypes function, or None without glibc."""
    libc = _glibc()
    fn = getattr(libc, name, None) if libc is not None else None
    if fn is not None:
        fn.argtypes, fn.restype = argtypes, restype
    return fn


def _find_mallopt():
    """glibc's mallopt, or None where the C library is not glibc or cannot be opened."""
    return _glibc_function("mallopt", [ctypes.c_int, ctypes.c_int])


def _find_malloc_trim():
    """glibc's malloc_trim, or None without glibc."""
    return _glibc_function("malloc_trim", [ctypes.c_size_t])


def pin_mmap_threshold(value: int = MMAP_THRESHOLD) -> bool:
    """Set glibc's mmap threshold to `value` bytes (fixed from then on), once per process; later calls do nothing.
    True if it is pinned. Without glibc's mallopt, or if it refuses, nothing changes and a debug line says why."""
    if _state["done"]:
        return _state["pinned"]
    _state["done"] = True
    fn = _find_mallopt()
    if fn is None:
        _log.debug("embed: glibc's mallopt not found (%s): the mmap threshold is left as it is", sys.platform)
        return False
    if fn(M_MMAP_THRESHOLD, int(value)) != 1:
        _log.debug("embed: mallopt(M_MMAP_THRESHOLD, %d) failed: the mmap threshold is left as it is", value)
        return False
    _state["pinned"] = True
    _log.debug("embed: glibc's mmap threshold pinned at %d bytes", value)
    return True


def release_between_windows() -> None:
    """Give back what a window left behind before the next one starts, so every window starts from the same state
    whatever ran before it: the CPU buffer cache's free blocks (sized for the last window's batch shapes; it refills
    within a window up to its own bound, csrc/cpu/buffer_cache.h) and, with glibc, the free pages inside malloc's
    arenas (malloc_trim(0): the heap and every thread's arena, where the tokenizer's and OpenMP threads' small
    blocks live). Costs one refill of the cache per window: a few hundred thousand page faults at most, against a
    window of thousands of texts."""
    from fastenc.extension import empty_cache

    empty_cache()
    fn = _find_malloc_trim()
    if fn is not None:
        fn(0)
