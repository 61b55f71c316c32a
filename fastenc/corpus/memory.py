"""The corpus job's memory stays flat as the corpus grows: glibc's mmap threshold is pinned once, at job start,
and each window starts from the same memory state (release_between_windows).

glibc's threshold is dynamic by default: freeing a large mmapped block raises it, so later blocks of that size come
from the heap. The job allocates activation buffers of a different size for every batch, which would fragment the
heap and make the peak grow with the number of batches; pinning the threshold with mallopt (at glibc's own starting
value, 128 KiB, process-wide, as MALLOC_MMAP_THRESHOLD_ would) keeps large buffers on mmap. The layers' repeated
large buffers come from the CPU buffer cache instead, whose free blocks, with free heap pages, are released after
each window. Measurements: bench/results/HISTORY.md (corpus job); background: docs/corpus.md.
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
