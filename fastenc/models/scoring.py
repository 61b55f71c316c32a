"""Pair scoring and reranking with a text sequence classifier (a cross-encoder): `model.score(pairs)` and
`model.rerank(query, documents)`, scored as sentence-transformers' `CrossEncoder.predict` / `rank` do.

Pairs are tokenized together by the folder's tokenizer (its pair template, token types where the architecture takes
them, truncation longest-first to the model's maximum length), run in length-sorted batches, and the logits pass
through the checkpoint's activation: the one its sentence-transformers files name (`activation_fn`), else sigmoid
for one label and identity for more, as CrossEncoder applies them. raw=True returns the logits.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

import torch

# Activations a CrossEncoder folder may name, by their torch class (the only ones a folder can select here).
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Sigmoid": torch.sigmoid,
    "Identity": lambda t: t,
    "Tanh": torch.tanh,
    "Softmax": lambda t: torch.softmax(t, dim=-1),
    "ReLU": torch.relu,
}


def read_activation(folder: Path) -> str | None:
    """The activation class path a sentence-transformers CrossEncoder folder names, else None:
    config_sentence_transformers.json's `activation_fn` (sentence-transformers 6), config.json's
    `sentence_transformers.activation_fn` (4-5) or `sbert_ce_default_activation_function` (older)."""
    for name, keys in (("config_sentence_transformers.json", ("activation_fn",)),
                       ("config.json", ("sentence_transformers", "activation_fn")),
                       ("config.json", ("sbert_ce_default_activation_function",))):
        try:
            value = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        for k in keys:
            value = value.get(k) if isinstance(value, dict) else None
        if isinstance(value, str) and value:
            return value
    return None


def activation(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """The function CrossEncoder applies to `model`'s logits (see the module docstring)."""
    path = model.encode_defaults.get("activation")
    if path:
        name = path.rsplit(".", 1)[-1]
        if path.startswith("torch.") and name in _ACTIVATIONS:
            return _ACTIVATIONS[name]
        raise ValueError(f"score: the model folder names the activation {path!r}; supported: "
                         f"{', '.join('torch.nn.' + n for n in _ACTIVATIONS)}")
    return torch.sigmoid if model.config.num_labels == 1 else _ACTIVATIONS["Identity"]


def check_scorer(name: str, model) -> None:
    if getattr(model, "task", None) != "sequence_classification":
        raise TypeError(f"{name}: needs a sequence-classification model (a cross-encoder), got "
                        f"{type(model).__name__} (task {getattr(model, 'task', None)!r})")
    if model.tokenizer is None:
        raise ValueError(f"{name}: needs the model folder's tokenizer.json; load the model with "
                         "fastenc.from_pretrained(folder) or call model.load_tokenizer(folder)")


def tokenize_pairs(tokenizer, pairs: Sequence[tuple[str, str]], max_length: int) -> list[tuple[list[int], list[int]]]:
    """(ids, token types) of each (first, second) pair, the tokenizer's pair template, cut longest-first."""
    tokenizer.enable_truncation(int(max_length))
    return [(e.ids, e.type_ids) for e in tokenizer.encode_batch([tuple(p) for p in pairs])]


def pad_rows(seqs: Sequence[Sequence[int]], types: Sequence[Sequence[int]] | None = None):
    """(ids (n, width) int64, mask (n, width) bool, types (n, width) int64 or None), 0-padded to the longest."""
    width = max(1, max((len(s) for s in seqs), default=1))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    tt = None if types is None else torch.zeros(len(seqs), width, dtype=torch.long)
    for r, s in enumerate(seqs):
        if len(s):
            ids[r, :len(s)] = torch.as_tensor(s, dtype=torch.long)
            mask[r, :len(s)] = True
            if tt is not None:
                tt[r, :len(s)] = torch.as_tensor(types[r], dtype=torch.long)
    return ids, mask, tt


def classify_rows(model, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor | None) -> torch.Tensor:
    """The classifier's logits for a padded batch, token types passed where the architecture takes them."""
    from fastenc.models.architecture import of_model

    device = next(model.parameters()).device
    args = (ids.to(device), mask.to(device))
    if of_model(model).token_types:
        args += (None if types is None else types.to(device),)
    return model(*args)


@torch.inference_mode()
def score(model, pairs, *, raw: bool = False, batch_size: int = 32, max_length: int | None = None) -> torch.Tensor:
    """Scores (n,) for one label, else (n, num_labels), fp32, in the order of `pairs` ((text, text) each)."""
    check_scorer("score", model)
    if isinstance(pairs, tuple) and len(pairs) == 2 and all(isinstance(t, str) for t in pairs):
        pairs = [pairs]
    pairs = list(pairs)
    bad = next((i for i, p in enumerate(pairs) if not (isinstance(p, (tuple, list)) and len(p) == 2
                                                       and all(isinstance(t, str) for t in p))), None)
    if bad is not None:
        raise TypeError(f"score: pairs must be (text, text) pairs, got {pairs[bad]!r} at index {bad}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"score: batch_size must be a positive int, got {batch_size!r}")
    n_labels = model.config.num_labels
    if not pairs:
        return torch.empty((0,) if n_labels == 1 else (0, n_labels))
    limit = min(int(max_length or model.encode_defaults.get("max_length") or model.config.max_position_embeddings),
                int(model.config.max_position_embeddings))
    enc = tokenize_pairs(model.tokenizer, pairs, limit)
    order = sorted(range(len(enc)), key=lambda i: -len(enc[i][0]))
    out = torch.empty(len(enc), n_labels)
    act = None if raw else activation(model)
    for a in range(0, len(order), batch_size):
        rows = order[a:a + batch_size]
        ids, mask, types = pad_rows([enc[i][0] for i in rows], [enc[i][1] for i in rows])
        logits = classify_rows(model, ids, mask, types).float().cpu()
        out[torch.tensor(rows)] = logits if act is None else act(logits)
    return out[:, 0] if n_labels == 1 else out


def rerank(model, query: str, documents: Sequence[str], *, top_n: int | None = None, raw: bool = False,
           return_documents: bool = False, batch_size: int = 32, max_length: int | None = None) -> list[dict]:
    """Documents by relevance to `query`, best first: [{"index", "score"[, "text"]}], the top_n best (all when
    None). Needs a one-label classifier (a reranker)."""
    if not isinstance(query, str):
        raise TypeError(f"rerank: query must be a str, got {type(query).__name__}")
    if isinstance(documents, str) or not all(isinstance(d, str) for d in documents):
        raise TypeError("rerank: documents must be a list of str")
    check_scorer("rerank", model)
    if model.config.num_labels != 1:
        raise ValueError(f"rerank: needs a one-label classifier (a reranker), got num_labels="
                         f"{model.config.num_labels}; use model.score(pairs) for several labels")
    if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1):
        raise ValueError(f"rerank: top_n must be a positive int or None, got {top_n!r}")
    documents = list(documents)
    scores = score(model, [(query, d) for d in documents], raw=raw, batch_size=batch_size, max_length=max_length)
    return ranked(scores.tolist(), documents if return_documents else None, top_n)


def ranked(scores: Sequence[float], documents: Sequence[str] | None, top_n: int | None) -> list[dict]:
    """[{"index", "score"[, "text"]}] best first (ties keep the input order), cut to top_n."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:top_n]
    return [{"index": i, "score": float(scores[i]), **({"text": documents[i]} if documents is not None else {})}
            for i in order]

