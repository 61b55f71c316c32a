"""Dynamic batching: a queue of requests' inputs and one model worker thread.

Each request's tokenized inputs enter the queue as chunks of at most `max_batch_tokens` real tokens (and
`max_batch_requests` inputs). Whenever the worker is free it takes chunks from the head of the queue while they fit
the budget (always at least one), skipping those of requests whose client went away, runs one packed forward
(the model unpads once: cost follows real tokens, not padding) and hands each request its rows; a request whose
chunks are all done is answered on its event loop. With `max_wait_ms` the worker waits up to that long after the
oldest queued input for a fuller batch; without it, it runs whatever is queued at once. A forward that raises fails
the requests of its batch only.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque

import numpy as np

from fastenc.serve.service import Encoded, Service


class Job:
    """One request's inputs in the queue, and the future its handler awaits."""

    __slots__ = ("enc", "loop", "future", "parts", "pending", "cancelled", "failed", "enqueued")

    def __init__(self, enc: Encoded, loop: asyncio.AbstractEventLoop):
        self.enc, self.loop = enc, loop
        self.future = loop.create_future()
        self.parts: dict[int, object] = {}
        self.pending = 0
        self.cancelled = self.failed = False
        self.enqueued = time.perf_counter()

    def _resolve(self, value=None, error: BaseException | None = None) -> None:
        def done():
            if not self.future.done():
                if error is not None:
                    self.future.set_exception(error)
                else:
                    self.future.set_result(value)
        self.loop.call_soon_threadsafe(done)

    def result(self):
        """The rows in input order: an array (n, ...) or, for token labels, a list of arrays."""
        pieces = [self.parts[k] for k in sorted(self.parts)]
        if isinstance(pieces[0], list):
            return [r for p in pieces for r in p]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


class ForwardError(RuntimeError):
    """The model's forward raised for a batch this request was in."""


class Batcher:
    def __init__(self, service: Service, metrics=None):
        self.service, self.metrics = service, metrics
        lim = service.limits
        self.budget, self.max_rows = lim.max_batch_tokens, lim.max_batch_requests or 1 << 30
        self.max_wait = None if lim.max_wait_ms is None else lim.max_wait_ms / 1000.0
        self._queue: deque = deque()      # (job, start, end, tokens)
        self._queued_inputs = 0
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self.batches = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fastenc-model-worker", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job's inputs as chunks that each fit one batch."""
        lens = [int(a.size) for a in job.enc.ids]
        chunks, start, tokens = [], 0, 0
        for i, n in enumerate(lens):
            if i > start and (tokens + n > self.budget or i - start >= self.max_rows):
                chunks.append((job, start, i, tokens))
                start, tokens = i, 0
            tokens += n
        chunks.append((job, start, len(lens), tokens))
        job.pending = len(chunks)
        with self._cond:
            if self._closing:
                raise RuntimeError("serve: the model worker is stopping")
            self._queue.extend(chunks)
            self._queued_inputs += len(lens)
            self._depth()
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """Drop a job whose client went away: its queued chunks are skipped, never run."""
        job.cancelled = True

    def stop(self, timeout: float | None = None) -> bool:
        """Finish what is queued, then end the worker; False if it did not end within timeout."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def queued_inputs(self) -> int:
        return self._queued_inputs

    def _depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(self._queued_inputs)

    def _take(self) -> list:
        """Chunks from the head of the queue that fit the budget (the caller holds the lock)."""
        batch, tokens, rows = [], 0, 0
        while self._queue:
            job, a, b, t = self._queue[0]
            if job.cancelled or job.failed:
                self._queue.popleft()
                self._queued_inputs -= b - a
                continue
            if batch and (tokens + t > self.budget or rows + (b - a) > self.max_rows):
                break
            self._queue.popleft()
            self._queued_inputs -= b - a
            batch.append((job, a, b, t))
            tokens, rows = tokens + t, rows + (b - a)
        self._depth()
        return batch

    def _wait_for_fuller(self) -> None:
        """With max_wait_ms: wait until the queued tokens fill the budget or the oldest input waited that long."""
        deadline = self._queue[0][0].enqueued + self.max_wait
        while not self._closing:
            queued = sum(c[3] for c in self._queue)
            left = deadline - time.perf_counter()
            if queued >= self.budget or left <= 0:
                return
            self._cond.wait(left)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue and self._closing:
                    return
                if self.max_wait:
                    self._wait_for_fuller()
                batch = self._take()
            if batch:
                self._forward(batch)

    def _forward(self, batch: list) -> None:
        svc, m = self.service, self.metrics
        t0 = time.perf_counter()
        seqs, types, pairs = [], [], any(job.enc.types is not None for job, *_ in batch)
        for job, a, b, _ in batch:
            seqs.extend(job.enc.ids[a:b])
            if pairs:
                types.extend(job.enc.types[a:b] if job.enc.types is not None
                             else [np.zeros_like(s) for s in job.enc.ids[a:b]])
            if m is not None:
                m.queue_time.observe(t0 - job.enqueued)
        try:
            out = svc.forward(*svc.pad(seqs, types if pairs else None))
        except Exception as e:  # this batch's requests fail; the worker goes on
            err = ForwardError(f"the model's forward failed: {type(e).__name__}: {e}")
            for job, *_ in batch:
                if not job.failed:
                    job.failed = True
                    job._resolve(error=err)
            return
        finally:
            self.batches += 1
            if m is not None:
                m.inference_time.observe(time.perf_counter() - t0)
                m.batch_size.observe(len(seqs))
                m.batch_tokens.observe(sum(c[3] for c in batch))
        row = 0
        for job, a, b, _ in batch:
            job.parts[a] = out[row:row + (b - a)]
            row += b - a
            job.pending -= 1
            if job.pending == 0 and not job.failed:
                job._resolve(job.result())
