"""The server's limits and settings (the model's quantization), checked once when the app is made (each error names
the setting)."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Limits:
    max_batch_tokens: int = 16384          # real tokens one forward packs
    max_batch_requests: int | None = None  # inputs (sequences) one forward takes; None: no count limit
    max_concurrent_requests: int = 512     # inputs in flight (queued or running); over it: 429 at once
    max_client_batch_size: int = 32        # inputs in one request; over it: 413
    payload_limit: int = 2_000_000         # request body bytes; over it: 413
    max_wait_ms: float | None = None       # wait this long for a fuller batch (None: run whatever is queued)
    auto_truncate: bool = True             # cut inputs over the model's maximum length unless truncate=false
    max_input_length: int | None = None    # None: the model's (sentence-transformers max_seq_length, else positions)
    graceful_timeout: float = 30.0         # seconds SIGTERM waits for in-flight and queued work
    api_key: str | None = None             # every route but /health needs "Authorization: Bearer <key>"
    served_model_name: str | None = None   # the `model` name requests may give (default: the folder's name)
    tokenization_workers: int = 1          # threads tokenizing off the event loop and the model thread
    warmup: bool = True                    # one forward before /health turns 200
    quantize: str | None = None            # None (fp32) | "int8": fastenc.quantize after the model loads (CPU fp32)

    def __post_init__(self):
        def positive_int(name, allow_none=False):
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"serve: {name} must be a positive int{' or None' if allow_none else ''}, "
                                 f"got {v!r}")

        for name in ("max_batch_tokens", "max_concurrent_requests", "max_client_batch_size", "payload_limit",
                     "tokenization_workers"):
            positive_int(name)
        positive_int("max_batch_requests", allow_none=True)
        positive_int("max_input_length", allow_none=True)
        if self.max_wait_ms is not None and (isinstance(self.max_wait_ms, bool) or
                                             not isinstance(self.max_wait_ms, (int, float)) or
                                             not 0 <= self.max_wait_ms <= 60_000):
            raise ValueError(f"serve: max_wait_ms must be a number in [0, 60000] or None, got {self.max_wait_ms!r}")
        if isinstance(self.graceful_timeout, bool) or not isinstance(self.graceful_timeout, (int, float)) \
                or self.graceful_timeout < 0:
            raise ValueError(f"serve: graceful_timeout must be a number of seconds >= 0, got "
                             f"{self.graceful_timeout!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key):
            raise ValueError("serve: api_key must be a non-empty string or None")
        from fastenc.corpus.quantization import check

        check(self.quantize, "serve: quantize")

    @classmethod
    def make(cls, **kwargs) -> "Limits":
        """Limits from keyword arguments (an unknown name is an error naming it); api_key defaults to the
        FASTENC_API_KEY environment variable."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"serve: unknown setting(s) {unknown}; known: {sorted(known)}")
        if kwargs.get("api_key") is None and os.environ.get("FASTENC_API_KEY"):
            kwargs["api_key"] = os.environ["FASTENC_API_KEY"]
        return cls(**kwargs)
