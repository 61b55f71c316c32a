"""What the corpus job holds does not grow with the corpus: tokenizing keeps only the kept ids of a window, batches
are built one at a time, and at every window boundary the job holds the same Python memory however many windows ran
before (fastenc/corpus/job.py, batching.py)."""
import gc
import logging
import tracemalloc

import numpy as np
import pytest
import torch

import fastenc
from fastenc.corpus import job
from fastenc.corpus.batching import token_budget_batches


def test_tokenize_in_chunks_keeps_ids_and_cut_flags(monkeypatch, minilm, texts):
    """Chunked tokenizing gives the ids and truncation flags of one whole-window call, as int32 arrays."""
    tok = minilm.tokenizer
    tok.enable_truncation(64)
    whole = tok.encode_batch(texts)
    monkeypatch.setattr(job, "TOKENIZE_CHUNK", 7)  # 60 texts: 9 chunks, the last one short
    ids, cut = job.tokenize(minilm, texts, 64)
    assert len(ids) == len(cut) == len(texts)
    assert all(isinstance(a, np.ndarray) and a.dtype == np.int32 for a in ids)
    assert [a.tolist() for a in ids] == [e.ids for e in whole]
    assert cut == [bool(e.overflowing) for e in whole] and any(cut) and not all(cut)


def test_batches_are_built_as_iterated():
    g = torch.Generator().manual_seed(5)
    seqs = [np.arange(1, int(n) + 1, dtype=np.int32) for n in torch.randint(0, 200, (77,), generator=g)]
    it = token_budget_batches(seqs, max_batch_tokens=600, max_batch_size=11)
    assert not isinstance(it, list)
    first = next(it)  # one batch built; the rest when asked for
    rest = list(it)
    want = [b for b in token_budget_batches([s.tolist() for s in seqs], 600, 11)]
    assert len(rest) + 1 == len(want) >= 10
    for b, w in zip([first, *rest], want):
        assert b.rows == w.rows and b.tokens == w.tokens
        assert torch.equal(b.ids, w.ids) and torch.equal(b.mask, w.mask)


# Where the background threads of a process that once ran a Ray Data job allocate (Ray Data's metrics poller lives
# on after ray.shutdown() and polls over HTTP every 10 s): not the job's memory, and may be live at any window end.
# The suite's Ray tests run Ray in child processes; this keeps the test true in a process that did not.
OTHER_THREADS = ("/ray/", "/urllib3/", "/requests/", "/http/", "/socket.py", "/threading.py", "/tracemalloc.py")


def _traced_at_window_ends(monkeypatch, minilm, inputs, out):
    """(summary, Python memory traced (tracemalloc) and reachable at each window's end, after the job's release)"""
    seen = []
    real = job.release_between_windows

    def spy():
        real()
        gc.collect()  # what is held, not garbage that waits for the cycle collector
        stats = tracemalloc.take_snapshot().statistics("filename")
        seen.append(sum(st.size for st in stats if not any(f in st.traceback[0].filename for f in OTHER_THREADS)))

    monkeypatch.setattr(job, "release_between_windows", spy)
    # No log records meanwhile: those other threads log failed polls with their tracebacks, and pytest's logging
    # capture keeps every record until the test ends (the job's memory would seem to grow by ~85 KB per poll).
    disabled = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    tracemalloc.start()
    try:
        s = fastenc.embed(inputs, minilm, out=out, window=8, max_batch_tokens=256)
    finally:
        tracemalloc.stop()
        logging.disable(disabled)
    return s, seen


@pytest.mark.parametrize("fmt", [".npy", ".parquet"])
def test_job_holds_the_same_memory_at_every_window_end(monkeypatch, minilm, tmp_path, fmt):
    """The same 8 texts 24 times over: every window is alike, so what the job holds at window end must not grow
    with the windows done. Each window's embeddings alone are 8 x 384 x 4 = 12 KiB (numpy's buffers are traced):
    keeping them, or its texts and ids, would add over 200 KiB between the 5th and the last window."""
    src = tmp_path / "in.txt"
    lines = [f"passage {i}: " + "some words of a sentence " * (1 + i % 5) for i in range(8)]
    src.write_text("\n".join(lines * 24) + "\n")
    s, seen = _traced_at_window_ends(monkeypatch, minilm, str(src), tmp_path / f"o{fmt}")
    assert s.texts == 192 and len(seen) == 24
    growth = seen[-1] - seen[4]
    assert growth < 48 * 1024, f"the job's traced memory grew by {growth} bytes over 19 windows: {seen}"
