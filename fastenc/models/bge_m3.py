"""BGE-M3's three outputs from one forward of its XLM-RoBERTa encoder (Chen et al. 2024, "BGE M3-Embedding"; the
math of FlagEmbedding's BGEM3 model): dense = normalize(h[CLS]); sparse = per token id, the max over the text's
tokens carrying it of relu(sparse_linear(h_t)), special tokens (cls, eos, pad, unk) excluded; colbert =
normalize(colbert_linear(h_t)) for every real token but the first. The two heads are the folder's
sparse_linear.pt (Linear(hidden, 1)) and colbert_linear.pt (Linear(hidden, dim)), read by load_heads (which
fastenc.from_pretrained calls) and kept outside the module tree (save_pretrained writes the encoder only)."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from fastenc.models.retrieval import MultiVectors, ragged, restore_order
from fastenc.models.scoring import pad_rows

HEAD_FILES = {"sparse": "sparse_linear.pt", "colbert": "colbert_linear.pt"}
# Special tokens BGE-M3 leaves out of the sparse weights (its tokenizer's cls, eos, pad and unk), by their strings.
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>", "<unk>", "[CLS]", "[SEP]", "[PAD]", "[UNK]")


def heads_of(model) -> dict:
    """The BGE-M3 heads set on `model`: {"sparse": (weight, bias), "colbert": (weight, bias)}, either may be absent."""
    return model.__dict__.setdefault("retrieval_heads", {})


def set_head(model, name: str, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Set head `name` ('sparse': weight (1, hidden); 'colbert': weight (dim, hidden)); bias (out,) or None."""
    if name not in HEAD_FILES:
        raise ValueError(f"set_head: name must be one of {tuple(HEAD_FILES)}, got {name!r}")
    hidden = model.config.hidden_size
    rows = 1 if name == "sparse" else None
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != hidden or \
            (rows is not None and weight.shape[0] != rows):
        raise ValueError(f"set_head: the {name} weight must be ({rows or 'dim'}, {hidden}), got "
                         f"{tuple(getattr(weight, 'shape', ())) or type(weight).__name__}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"set_head: the {name} bias must be ({weight.shape[0]},), got {tuple(bias.shape)}")
    heads_of(model)[name] = (weight.detach(), None if bias is None else bias.detach())


def load_heads(model, folder: str | Path) -> list[str]:
    """Read BGE-M3's sparse_linear.pt / colbert_linear.pt (state dicts of nn.Linear) from `folder` into the model's
    heads; returns the names read (none when the folder has neither file)."""
    folder = Path(folder)
    done = []
    for name, file in HEAD_FILES.items():
        path = folder / file
        if not path.is_file():
            continue
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise ValueError(f"load_heads: cannot read {path}: {type(e).__name__}: {e}") from None
        if not isinstance(sd, dict) or not isinstance(sd.get("weight"), torch.Tensor):
            raise ValueError(f"load_heads: {path} must hold an nn.Linear state dict (weight, bias)")
        set_head(model, name, sd["weight"].float(), None if sd.get("bias") is None else sd["bias"].float())
        done.append(name)
    return done


def special_ids(model) -> list[int] | None:
    """Token ids left out of the sparse weights: those of SPECIAL_TOKENS the model's tokenizer knows (None
    without a tokenizer)."""
    tok = model.tokenizer
    if tok is None:
        return None
    found = {tok.token_to_id(t) for t in SPECIAL_TOKENS}
    return sorted(i for i in found if i is not None)


def _linear(x, head):
    w, b = head
    return F.linear(x, w.to(device=x.device, dtype=x.dtype), None if b is None else b.to(device=x.device, dtype=x.dtype))


def _sparse_rows(x, ids, batch, head, specials: torch.Tensor):
    """Per sequence (unique token ids int64 sorted by weight, largest first; weights fp32): max over the tokens of
    each id of relu(sparse_linear(h_t)), special ids and zero weights left out."""
    w = torch.relu(_linear(x, head).float().squeeze(-1))
    out = []
    cu = batch.cu_seqlens.tolist()
    for a, e in zip(cu, cu[1:]):
        tid, tw = ids[a:e], w[a:e]
        keep = ~torch.isin(tid, specials) & (tw > 0)
        tid, tw = tid[keep], tw[keep]
        uniq, inv = torch.unique(tid, return_inverse=True)
        vals = torch.zeros(uniq.shape[0], device=w.device).scatter_reduce(0, inv, tw, "amax", include_self=False)
        vals, order = torch.sort(vals, descending=True, stable=True)
        out.append((uniq[order], vals))
    return out


@torch.inference_mode()
def encode_m3(model, inputs, *, batch_size: int = 32, max_length: int | None = None, dense: bool = True,
              sparse: bool = True, colbert: bool = True, exclude_ids=None) -> dict:
    """BGE-M3's outputs of `inputs` (a string, a list of strings, or a list of token-id lists) from one forward:
    {"dense": fp32 (n, hidden) unit rows, "sparse": per text (token ids int64 (k,), weights fp32 (k,)) largest
    first, "colbert": MultiVectors (offsets (n+1,), vectors (tokens, dim)) of unit rows, each text's first token
    left out}; only the outputs asked for. sparse / colbert need their head (load_heads / set_head).
    exclude_ids: token ids kept out of the sparse weights (default: the tokenizer's cls, eos, pad and unk, as
    BGE-M3 does; a model without a tokenizer must name them)."""
    heads = heads_of(model)
    for name, on in (("sparse", sparse), ("colbert", colbert)):
        if on and name not in heads:
            raise ValueError(f"encode_m3: {name}=True needs the {name} head ({HEAD_FILES[name]} in the model folder, "
                             f"or fastenc.models.bge_m3.set_head)")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"encode_m3: batch_size must be a positive int, got {batch_size!r}")
    if isinstance(inputs, str):
        inputs = [inputs]
    inputs = list(inputs)
    if inputs and all(isinstance(t, str) for t in inputs):
        limit = max_length or model.encode_defaults.get("max_length") or model.config.max_position_embeddings
        seqs = model._tokenize(inputs, limit)
    elif all(isinstance(t, (list, tuple)) for t in inputs):
        seqs = [list(t) for t in inputs]
    else:
        raise TypeError("encode_m3: inputs must be a str, a list of str or a list of token-id lists")
    device = next(model.parameters()).device
    if exclude_ids is None:
        exclude_ids = special_ids(model)
        if exclude_ids is None and sparse:
            raise ValueError("encode_m3: sparse=True needs exclude_ids= (the cls, eos, pad and unk ids BGE-M3 leaves "
                             "out of the sparse weights) when the model has no tokenizer")
    specials = torch.tensor(list(exclude_ids or ()), dtype=torch.int64, device=device)
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))  # longest first, as encode() batches
    dense_out, sparse_out, colbert_out = [], [], []
    for a in range(0, len(order), batch_size):
        ids, mask, _ = pad_rows([seqs[i] for i in order[a:a + batch_size]])
        ids, mask = ids.to(device), mask.to(device)
        x, batch = model._encode(ids, mask, None)
        if dense:
            dense_out.append(F.normalize(batch.first_tokens(x).float(), dim=-1))
        if sparse:
            sparse_out.extend(_sparse_rows(x, batch.gather(ids), batch, heads["sparse"], specials))
        if colbert:
            v = F.normalize(_linear(x, heads["colbert"]).float(), dim=-1)
            cu = batch.cu_seqlens.tolist()
            colbert_out.extend(v[min(a + 1, e):e] for a, e in zip(cu, cu[1:]))
    out = {}
    if dense:
        d = torch.cat(dense_out) if dense_out else torch.empty(0, model.config.hidden_size, device=device)
        res = torch.empty_like(d)
        res[torch.tensor(order, dtype=torch.int64, device=d.device)] = d
        out["dense"] = res
    if sparse:
        out["sparse"] = restore_order(sparse_out, order)
    if colbert:
        out["colbert"] = ragged(restore_order(colbert_out, order), heads["colbert"][0].shape[0], device)
    return out


__all__ = ["MultiVectors", "encode_m3", "load_heads", "set_head", "special_ids"]
