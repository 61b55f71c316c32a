"""Between windows the corpus job gives back what a window left behind (fastenc/corpus/memory.py
release_between_windows): the CPU buffer cache's free blocks and, with glibc, malloc's free pages (malloc_trim(0)),
so each window starts from the same memory state whatever ran before it."""
import pytest
import torch

import fastenc
from fastenc import extension
from fastenc.corpus import job, memory


@pytest.fixture
def windows_seen(monkeypatch):
    """Per window, at the moment it starts embedding: the buffer cache's free bytes and the malloc_trim calls so far;
    a recording malloc_trim."""
    trims, seen = [], []

    def fake_trim(pad):
        trims.append(pad)
        return 1

    monkeypatch.setattr(memory, "_find_malloc_trim", lambda: fake_trim)
    real = job.embed_ids

    def spy(*a, **k):
        seen.append((extension.buffer_cache_stats()["cached_bytes"], len(trims)))
        return real(*a, **k)

    monkeypatch.setattr(job, "embed_ids", spy)
    return seen, trims


def _fill_cache():
    """Leave a free 1 MiB block in the buffer cache (the extension is built if needed)."""
    extension.load()
    t = extension.buffer_empty((256, 1024), torch.empty(0))
    assert t is not None, "the buffer cache is off (FASTENC_CPU_CACHE=0?)"
    del t
    assert extension.buffer_cache_stats()["cached_bytes"] >= 1 << 20


@pytest.mark.parametrize("out", [None, "o.npy", "o.parquet"])
def test_every_window_starts_with_an_empty_cache(windows_seen, minilm, texts, tmp_path, out):
    seen, trims = windows_seen
    n_windows = -(-len(texts) // 16)
    opts = dict(window=16, max_batch_tokens=512)
    _fill_cache()
    if out is None:
        r = fastenc.embed(texts, minilm, **opts)
        assert r.embeddings.shape == (len(texts), minilm.config.hidden_size)
    else:
        s = fastenc.embed(texts, minilm, out=tmp_path / out, **opts)
        assert s.texts == len(texts) and s.shards == n_windows
    assert len(seen) == n_windows
    # the first window finds the block left before the job; every later one an empty cache, after one trim per
    # window before it
    assert seen[0][0] >= 1 << 20 and seen[0][1] == 0
    assert seen[1:] == [(0, i) for i in range(1, n_windows)]
    assert trims == [0] * n_windows  # malloc_trim(0) after each window, the last included


def test_release_without_glibc(monkeypatch):
    """Without glibc's malloc_trim only the cache is released."""
    monkeypatch.setattr(memory.sys, "platform", "darwin")
    assert memory._find_malloc_trim() is None
    _fill_cache()
    memory.release_between_windows()
    assert extension.buffer_cache_stats()["cached_bytes"] == 0


def test_real_malloc_trim_is_found():
    import platform
    import sys

    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    fn = memory._find_malloc_trim()
    assert fn is not None and fn(0) in (0, 1)
