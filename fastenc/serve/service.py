"""What the server runs: one model folder, its kind, its tokenizers and the forward of one packed batch.

The folder's head decides the kind: a base encoder embeds (pooling and normalization as its sentence-transformers
files say), a sequence classifier classifies (and reranks when it has one label: a cross-encoder), a token
classifier labels tokens. Tokenization uses three copies of the folder's tokenizer, one per truncation setting
(none, right, left), set once, so that threads tokenize concurrently without changing a shared tokenizer.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fastenc.serve.settings import Limits

EMBED, CLASSIFY, TOKENS = "embed", "classify", "token_classify"
_KINDS = {"base": EMBED, "sequence_classification": CLASSIFY, "token_classification": TOKENS}


class InputError(ValueError):
    """A client's mistake in what it sent: answered with `status` and a JSON error."""

    def __init__(self, message: str, status: int = 422, error_type: str = "Validation"):
        super().__init__(message)
        self.status, self.error_type = status, error_type


@dataclass
class Encoded:
    """Token ids of the inputs of one request, ready for the queue."""
    ids: list            # one int64 array per input
    types: list | None   # token types per input (pairs), or None
    tokens: int          # real tokens in all
    offsets: list | None = None  # per input: (start, end) character offsets per token (token labels)


class Service:
    """The model and everything a request needs from it; `load()` builds it (seconds, plus the extension's first
    build), after which the methods are safe to call from several threads."""

    def __init__(self, model_dir=None, limits: Limits | None = None, device: str | None = None):
        self.limits = limits or Limits()
        self.model_dir = model_dir
        self.device = device
        self.model = None
        self.kind = None
        self.loaded_at = None
        self.quantization = None  # quantization.describe(model) once loaded: None for fp32

    # ---- loading -------------------------------------------------------------------------------------------
    def load(self) -> "Service":
        from fastenc.corpus import quantization
        from fastenc.corpus.job import default_model_path
        from fastenc.corpus.memory import pin_mmap_threshold
        from fastenc.models.architecture import of_model

        import fastenc

        pin_mmap_threshold()  # the corpus job's rule: batches of every size must not fragment the heap
        folder = Path(self.model_dir) if self.model_dir is not None else default_model_path()
        if not folder.is_dir():
            raise FileNotFoundError(f"serve: model folder {str(folder)!r} does not exist")
        quantization.check_placement(self.limits.quantize, self.device, None, "serve: quantize")
        model = fastenc.from_pretrained(folder, device=self.device).eval()
        quantization.apply(model, self.limits.quantize, "serve: quantize")
        self.quantization = quantization.describe(model)
        spec = of_model(model)
        task = getattr(model, "task", "base")
        if spec.modality != "text" or task not in _KINDS:
            raise ValueError(f"serve: {folder} holds a {type(model).__name__} ({spec.model_type}, {task}); the server "
                             f"serves text encoders, sequence classifiers and token classifiers")
        if model.tokenizer is None:
            raise ValueError(f"serve: {folder} has no tokenizer.json; the server tokenizes text with it")
        self.folder, self.model, self.spec, self.kind = folder, model, spec, _KINDS[task]
        default_name = "all-MiniLM-L6-v2" if self.model_dir is None else folder.name
        self.name = self.limits.served_model_name or default_name
        cfg = model.config
        positions = int(model.encode_defaults.get("max_length") or cfg.max_position_embeddings)
        self.max_input_length = min(positions, int(cfg.max_position_embeddings),
                                    self.limits.max_input_length or positions)
        self.vocab_size = int(cfg.vocab_size)
        self.pooling = model.encode_defaults.get("pooling") or spec.pooling
        if self.pooling not in ("mean", "cls"):  # (CLIP's and SigLIP's own text embedding: encode(), not served)
            raise ValueError(f"serve: {folder} holds a {type(model).__name__} whose embedding is its own pooled "
                             f"output (pooling {self.pooling!r}); the server pools 'mean' or 'cls' (a folder's "
                             f"1_Pooling/config.json chooses one)")
        self.normalize_default = bool(model.encode_defaults.get("normalize", False))
        self.num_labels = int(getattr(cfg, "num_labels", 0) or 0)
        labels = getattr(cfg, "id2label", None) or {}
        self.labels = [str(labels.get(i, labels.get(str(i), f"LABEL_{i}"))) for i in range(self.num_labels)]
        self.multi_label = getattr(cfg, "problem_type", None) == "multi_label_classification"
        self.reranks = self.kind == CLASSIFY and self.num_labels == 1
        if self.reranks:
            from fastenc.models.scoring import activation
            self.activation = activation(model)
        self.hidden = int(cfg.hidden_size)
        self.device_ = next(model.parameters()).device
        self._tokenizers = {}
        for key in (None, "right", "left"):
            tok = type(model.tokenizer).from_str(model.tokenizer.to_str())
            tok.no_padding()
            if key is None:
                tok.no_truncation()
            else:
                tok.enable_truncation(self.max_input_length, direction=key)
            self._tokenizers[key] = tok
        if self.limits.warmup:
            self.forward(*self.pad([np.arange(min(16, self.max_input_length)) % self.vocab_size], None))
        self.loaded_at = time.time()
        return self

    # ---- tokenization ---------------------------------------------------------------------------------------
    def _truncate(self, truncate: bool | None) -> bool:
        return self.limits.auto_truncate if truncate is None else bool(truncate)

    def tokenize(self, texts: Sequence, *, truncate: bool | None = None, direction: str = "right",
                 offsets: bool = False) -> Encoded:
        """Token ids of texts (str) or pairs ((str, str)); an input over the maximum length is cut (truncate)
        or refused with 413 naming its index and length."""
        if direction not in ("right", "left"):
            raise InputError(f"truncation_direction must be 'right' or 'left', got {direction!r}")
        cut = self._truncate(truncate)
        tok = self._tokenizers[direction if cut else None]
        enc = tok.encode_batch(list(texts))
        ids, types, offs, total = [], [], [] if offsets else None, 0
        pairs = bool(texts) and not isinstance(texts[0], str)
        for i, e in enumerate(enc):
            if len(e.ids) > self.max_input_length:
                raise InputError(f"input {i} is {len(e.ids)} tokens long, over the model's maximum of "
                                 f"{self.max_input_length}; send truncate=true to cut it", 413, "Validation")
            ids.append(np.asarray(e.ids, dtype=np.int64))
            if pairs:
                types.append(np.asarray(e.type_ids, dtype=np.int64))
            if offsets:
                offs.append(e.offsets)
            total += len(e.ids)
        return Encoded(ids, types if pairs else None, total, offs)

    def token_ids(self, seqs: Sequence[Sequence[int]], *, truncate: bool | None = None,
                  direction: str = "right") -> Encoded:
        """Token-id inputs as given (no special tokens added): each id checked against the vocabulary."""
        ids, total = [], 0
        for i, s in enumerate(seqs):
            a = np.asarray(s, dtype=np.int64)
            if a.size == 0:
                raise InputError(f"input {i} is an empty list of token ids")
            lo, hi = int(a.min()), int(a.max())
            if lo < 0 or hi >= self.vocab_size:
                raise InputError(f"input {i} holds token id {lo if lo < 0 else hi}, outside the vocabulary "
                                 f"[0, {self.vocab_size})")
            if a.size > self.max_input_length:
                if not self._truncate(truncate):
                    raise InputError(f"input {i} is {a.size} tokens long, over the model's maximum of "
                                     f"{self.max_input_length}; send truncate=true to cut it", 413)
                a = a[:self.max_input_length] if direction == "right" else a[-self.max_input_length:]
            ids.append(a)
            total += int(a.size)
        return Encoded(ids, None, total)

    def tokens_of(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[dict]]:
        """TEI's /tokenize: per text, [{id, text, special, start, stop}] (start/stop: character offsets)."""
        tok = self._tokenizers[None]
        out = []
        for text, e in zip(texts, tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)):
            row = []
            for tid, piece, special, (a, b) in zip(e.ids, e.tokens, e.special_tokens_mask, e.offsets):
                special = bool(special)
                row.append({"id": int(tid), "text": piece if special else text[a:b], "special": special,
                            "start": None if special else int(a), "stop": None if special else int(b)})
            out.append(row)
        return out

    # ---- the forward of one batch (the model worker's thread) -----------------------------------------------
    def pad(self, seqs: list, types: list | None):
        from fastenc.models.scoring import pad_rows
        return pad_rows(seqs, types)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor | None):
        """One packed forward of a padded batch: embeddings (n, hidden) pooled, logits (n, num_labels), or for
        token labels a list of (len_i, num_labels) arrays. Returns float32 numpy."""
        model = self.model
        ids, mask = ids.to(self.device_), mask.to(self.device_)
        types = None if types is None or not self.spec.token_types else types.to(self.device_)
        if self.kind == EMBED:
            x, packed = model._encode(ids, mask, types)
            emb = packed.mean(x) if self.pooling == "mean" else packed.first_tokens(x)
            return emb.float().cpu().numpy()
        args = (ids, mask, types) if self.spec.token_types else (ids, mask)
        logits = model(*args).float().cpu()
        if self.kind == CLASSIFY:
            return logits.numpy()
        lens = mask.sum(1).tolist()
        return [logits[r, :n].numpy() for r, n in enumerate(lens)]

    # ---- after the forward: per request ---------------------------------------------------------------------
    @staticmethod
    def finish_embeddings(emb: np.ndarray, normalize: bool, dimensions: int | None = None) -> np.ndarray:
        """Truncate to `dimensions` (Matryoshka) and L2-normalize when asked (always after truncation)."""
        if dimensions is not None:
            emb = emb[:, :dimensions]
        if normalize:
            emb = F.normalize(torch.from_numpy(np.ascontiguousarray(emb)), p=2, dim=-1).numpy()
        return emb

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """Softmax over the labels, or sigmoid per label (one label, or a multi-label classifier)."""
        t = torch.from_numpy(logits)
        if self.num_labels == 1 or self.multi_label:
            return torch.sigmoid(t).numpy()
        return torch.softmax(t, dim=-1).numpy()

    def relevance(self, logits: np.ndarray, raw: bool) -> list[float]:
        """A reranker's scores: logits (n, 1) through the checkpoint's activation unless raw."""
        t = torch.from_numpy(logits[:, 0].copy())
        return (t if raw else self.activation(t)).tolist()

    def info(self) -> dict:
        lim = self.limits
        if self.kind == EMBED:
            model_type = {"embedding": {"pooling": self.pooling, "normalize": self.normalize_default,
                                        "dimensions": self.hidden}}
        else:
            key = "reranker" if self.reranks else "classifier" if self.kind == CLASSIFY else "token_classifier"
            model_type = {key: {"id2label": {str(i): n for i, n in enumerate(self.labels)}}}
        import fastenc
        return {"model_id": self.name, "model_dir": str(self.folder), "architecture": self.spec.model_type,
                "model_class": type(self.model).__name__, "model_dtype": str(next(self.model.parameters()).dtype)
                .replace("torch.", ""), "model_type": model_type, "max_input_length": self.max_input_length,
                "max_batch_tokens": lim.max_batch_tokens, "max_batch_requests": lim.max_batch_requests,
                "max_concurrent_requests": lim.max_concurrent_requests,
                "max_client_batch_size": lim.max_client_batch_size, "payload_limit": lim.payload_limit,
                "auto_truncate": lim.auto_truncate, "max_wait_ms": lim.max_wait_ms,
                "tokenization_workers": lim.tokenization_workers, "quantization": self.quantization,
                "version": fastenc.__version__,
                "torch_threads": torch.get_num_threads()}
