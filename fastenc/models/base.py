"""Shared input checks for the text encoders and `encode()`: tokenize (tokenizers library, the model folder's
tokenizer.json), batch by length, run packed, pool (CLS or mean) and optionally L2-normalize."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from fastenc.files import read_json
from fastenc.padding import PackedBatch

_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def check_text_inputs(name: str, input_ids, attention_mask, token_type_ids, vocab_size: int,
                      max_positions: int | None, type_vocab_size: int | None = None):
    """Validate (batch, seq) token ids, mask and token types; returns them as 2-D tensors (mask bool or None)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in _INT_DTYPES:
        got = getattr(input_ids, "dtype", type(input_ids).__name__)
        raise TypeError(f"{name}: input_ids must be an integer tensor, got {got}")
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
        attention_mask = None if attention_mask is None else attention_mask.reshape(1, -1)
        token_type_ids = None if token_type_ids is None else token_type_ids.reshape(1, -1)
    if input_ids.dim() != 2:
        raise ValueError(f"{name}: input_ids must be (batch, seq), got shape {tuple(input_ids.shape)}")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"{name}: input_ids must hold at least one sequence of at least one token (batch >= 1, "
                         f"seq >= 1), got shape {tuple(input_ids.shape)}")
    lo, hi = (int(v) for v in torch.aminmax(input_ids))  # one pass over the ids, not two
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"{name}: input_ids must be in [0, {vocab_size}) (the vocabulary), got [{lo}, {hi}]")
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor):
            raise TypeError(f"{name}: attention_mask must be a tensor, got {type(attention_mask).__name__}")
        if tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(f"{name}: attention_mask must have input_ids' shape {tuple(input_ids.shape)}, got "
                             f"{tuple(attention_mask.shape)}")
        attention_mask = attention_mask.to(device=input_ids.device).bool()
    if token_type_ids is not None:
        if not isinstance(token_type_ids, torch.Tensor) or token_type_ids.dtype not in _INT_DTYPES:
            raise TypeError(f"{name}: token_type_ids must be an integer tensor, got "
                            f"{getattr(token_type_ids, 'dtype', type(token_type_ids).__name__)}")
        if tuple(token_type_ids.shape) != tuple(input_ids.shape):
            raise ValueError(f"{name}: token_type_ids must have input_ids' shape {tuple(input_ids.shape)}, got "
                             f"{tuple(token_type_ids.shape)}")
        if type_vocab_size is not None and token_type_ids.numel():
            lo, hi = (int(v) for v in torch.aminmax(token_type_ids))
            if lo < 0 or hi >= type_vocab_size:
                raise ValueError(f"{name}: token_type_ids must be in [0, {type_vocab_size}), got [{lo}, {hi}]")
    if max_positions is not None and input_ids.shape[1] > max_positions:  # (a sequence that fits needs no look)
        last = input_ids.shape[1]
        if attention_mask is not None:  # padding past the table is allowed: the last real column decides
            cols = attention_mask.any(0).nonzero()
            last = int(cols.max()) + 1 if cols.numel() else 0
        if last > max_positions:
            raise ValueError(f"{name}: sequence length {last} exceeds the position table "
                             f"(max_position_embeddings={max_positions})")
    return input_ids, attention_mask, token_type_ids


def pack_text(input_ids: torch.Tensor, attention_mask: torch.Tensor | None):
    """Unpad once: returns (PackedBatch, packed ids (total,), packed positions (total,) = column in the padded row)."""
    b, s = input_ids.shape
    batch = PackedBatch(attention_mask, b, s, input_ids.device)
    cols = torch.arange(s, device=input_ids.device)
    if batch.indices is None:  # nothing padded: the ids as they are, the columns row after row
        return batch, input_ids.reshape(-1), cols if b == 1 else cols.repeat(b)
    return batch, batch.gather(input_ids), batch.gather(cols.expand(b, s))


def first_real(hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """(batch, seq, hidden) -> (batch, hidden): each row's first real token (column 0 without a mask; zeros for
    a row with no real token)."""
    if attention_mask is None:
        return hidden[:, 0]
    if tuple(attention_mask.shape) != tuple(hidden.shape[:2]):
        raise ValueError(f"pool: attention_mask must have shape {tuple(hidden.shape[:2])} (batch, seq), got "
                         f"{tuple(attention_mask.shape)}")
    m = attention_mask.to(device=hidden.device).bool()
    col = m.int().argmax(dim=1)  # the first True (0 for an empty row, masked below)
    out = hidden[torch.arange(hidden.shape[0], device=hidden.device), col]
    return out.masked_fill(~m.any(dim=1, keepdim=True), 0)


def check_dimensions(name: str, dimensions, hidden: int) -> int | None:
    """Validate a Matryoshka width: None (keep every dimension) or an int in [1, hidden]; returns it."""
    if dimensions is None:
        return None
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 1 <= dimensions <= hidden:
        raise ValueError(f"{name}: dimensions must be an int in [1, {hidden}] (the model's hidden size) or None, got "
                         f"{dimensions!r}")
    return dimensions


def finish_embeddings(emb: torch.Tensor, normalize: bool, dimensions: int | None = None) -> torch.Tensor:
    """Pooled (n, hidden) -> fp32 (n, dimensions or hidden): the first `dimensions` columns kept (Matryoshka
    truncation), then L2-normalized when `normalize` (so a truncated embedding is unit length again)."""
    emb = emb.float()
    if dimensions is not None and dimensions < emb.shape[-1]:
        emb = emb[:, :dimensions]
    return F.normalize(emb, p=2, dim=-1) if normalize else emb


def make_batches(seqs: Sequence[Sequence[int]], batch_size: int):
    """Sort token-id lists by length (longest first) and pad each batch to its own longest.

    Returns (order, [(ids (b, width) int64, mask (b, width) bool)]); output row j of the concatenated batches
    belongs to input order[j].
    """
    from fastenc.models.scoring import pad_rows

    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    batches = []
    for a in range(0, len(order), batch_size):
        ids, mask, _ = pad_rows([seqs[i] for i in order[a:a + batch_size]])
        batches.append((ids, mask))
    return order, batches


class TextEncoderMixin:
    """`encode()` for the text encoders. The model class provides `_encode(ids, mask, types) -> (x, PackedBatch)`."""

    tokenizer = None
    tokenizer_folder = None  # the folder tokenizer.json was read from (save_pretrained copies its files)
    encode_defaults: dict = {}

    def load_tokenizer(self, folder: str | Path) -> None:
        """Read tokenizer.json and sentence-transformers settings (pooling, normalize, max length) from `folder`."""
        folder = Path(folder)
        defaults: dict = {}
        tok = None
        if (folder / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            try:
                tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
            except Exception as e:  # the tokenizers library's message does not name the file
                raise ValueError(f"load_tokenizer: cannot read {folder / 'tokenizer.json'}: {type(e).__name__}: "
                                 f"{e}") from None
            tok.no_padding()
            tok.no_truncation()
        pool_cfg = folder / "1_Pooling" / "config.json"
        if pool_cfg.is_file():
            p = read_json(pool_cfg, "load_tokenizer")
            defaults["pooling"] = "cls" if p.get("pooling_mode_cls_token") else "mean"
        mods = folder / "modules.json"
        if mods.is_file():
            m = read_json(mods, "load_tokenizer", list)
            defaults["normalize"] = any(isinstance(e, dict) and "Normalize" in str(e.get("type", "")) for e in m)
        st_cfg = folder / "sentence_bert_config.json"
        if st_cfg.is_file():
            defaults["max_length"] = read_json(st_cfg, "load_tokenizer").get("max_seq_length")
        from fastenc.models.scoring import read_activation

        act = read_activation(folder)
        if act is not None:  # a sentence-transformers CrossEncoder folder's activation (score / rerank)
            defaults["activation"] = act
        if tok is not None:
            object.__setattr__(self, "tokenizer", tok)
            object.__setattr__(self, "tokenizer_folder", folder.resolve())
        object.__setattr__(self, "encode_defaults", defaults)

    @property
    def text_config(self):
        """The config of the text encoder (the model's own; a two-tower model's text_config)."""
        return self.config

    @property
    def text_embedding_dim(self) -> int:
        """Width of `text_embedding` (encode's pooling='model'): the hidden size unless the model projects."""
        return self.text_config.hidden_size

    def _pad_tokenized(self, seqs: list[list[int]], max_length: int) -> list[list[int]]:
        """Token-id lists (of texts, or given) as the model takes them: as they are (SigLIP pads them to
        max_length)."""
        return seqs

    def _tokenize(self, texts: Sequence[str], max_length: int) -> list[list[int]]:
        if self.tokenizer is None:
            raise ValueError("encode: texts need a tokenizer; load the model with fastenc.from_pretrained(folder) "
                             "(a folder with tokenizer.json) or call model.load_tokenizer(folder), or pass token ids")
        self.tokenizer.enable_truncation(int(max_length))  # keeps the special tokens, as transformers does
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def encode_m3(self, inputs, *, batch_size: int = 32, max_length: int | None = None, dense: bool = True,
                  sparse: bool = True, colbert: bool = True, exclude_ids=None) -> dict:
        """BGE-M3's dense, sparse and colbert outputs from one forward (fastenc.models.bge_m3.encode_m3)."""
        from fastenc.models.bge_m3 import encode_m3
        return encode_m3(self, inputs, batch_size=batch_size, max_length=max_length, dense=dense, sparse=sparse,
                         colbert=colbert, exclude_ids=exclude_ids)

    def score(self, pairs, *, raw: bool = False, batch_size: int = 32, max_length: int | None = None):
        """A sequence classifier's scores of (text, text) pairs, as CrossEncoder.predict (see
        fastenc.models.scoring): (n,) for one label, else (n, num_labels)."""
        from fastenc.models.scoring import score
        return score(self, pairs, raw=raw, batch_size=batch_size, max_length=max_length)

    def rerank(self, query: str, documents, *, top_n: int | None = None, raw: bool = False,
               return_documents: bool = False, batch_size: int = 32) -> list[dict]:
        """A one-label classifier's ranking of documents for query, best first: [{index, score[, text]}]."""
        from fastenc.models.scoring import rerank
        return rerank(self, query, documents, top_n=top_n, raw=raw, return_documents=return_documents,
                      batch_size=batch_size)

    @torch.inference_mode()
    def encode(self, inputs, attention_mask: torch.Tensor | None = None, *, batch_size: int = 32,
               pooling: str | None = None, normalize: bool | None = None, max_length: int | None = None,
               show_progress: bool = False, dimensions: int | None = None, output: str = "dense",
               top_k: int | None = None, projection=None, skip_first_token: bool = False):
        """Sentence embeddings (n, hidden) (or (n, dimensions)) in fp32 on the model's device; with output=
        'sparse' or 'multi_vector' the retrieval outputs below (fastenc.models.retrieval), from the same forward.

        inputs: a string, a list of strings (tokenized with the folder's tokenizer.json), a list of token-id
        lists, or an int tensor (batch, seq) with an optional attention_mask.
        pooling: 'mean' | 'cls' | 'model' (default: the folder's sentence-transformers setting, else the
        architecture's `pooling`: 'mean' for most text encoders, 'model' for CLIP and SigLIP); 'model' is the text
        embedding the model itself defines (its `text_embedding`: CLIP's EOS token through text_projection,
        SigLIP's head on the last token), as sentence-transformers' get_text_features gives it;
        normalize: L2-normalize (default: True if the folder lists a Normalize module).
        dimensions: keep the first `dimensions` columns of each embedding (Matryoshka truncation, 1 <= dimensions
        <= hidden), re-normalized after the cut when `normalize` is on; None keeps them all.
        output: 'dense' (the pooled embeddings above), 'sparse' or 'multi_vector':
          'sparse' (a *ForMaskedLM model): SPLADE weights w[v] = log1p(relu(max over the text's tokens, special
          tokens included, of the MLM logit of v)), computed by fastenc.ops.sparse_max without forming the
          (tokens, vocab) logits. Returns a list, per text, of (indices int64 (k,), values fp32 (k,)): its non-zero
          entries, largest value first; top_k keeps at most that many.
          'multi_vector' (ColBERT): one L2-normalized fp32 vector per token, after the linear `projection` when
          given (a (dim, hidden) weight, a (weight, bias) pair or an nn.Linear; default: the model's
          `colbert_linear` attribute if set, else a BGE-M3 folder's colbert head, else none). Returns
          fastenc.models.retrieval.MultiVectors(offsets int64 (n+1,), vectors (total kept tokens, dim)), ragged:
          text i's vectors are vectors[offsets[i]:offsets[i+1]], nothing padded. skip_first_token=True leaves out each text's first
          token ([CLS]), as BGE-M3's colbert_vecs do; the default False keeps every token, as ColBERT does.
          pooling, normalize and dimensions apply to 'dense' only.
        """
        from fastenc.models import retrieval

        retrieval.check_output(self, output, top_k, projection, dimensions)
        proj = retrieval.resolve_projection(self, projection) if output == "multi_vector" else None
        if pooling is None:  # the folder's sentence-transformers setting, else the architecture's default
            from fastenc.models.architecture import of_model
            pooling = self.encode_defaults.get("pooling") or of_model(self).pooling
        own = hasattr(self, "text_embedding")
        if pooling not in ("mean", "cls") and not (pooling == "model" and own):
            choices = "'mean', 'cls' or 'model'" if own else "'mean' or 'cls'"
            raise ValueError(f"encode: pooling must be {choices}, got {pooling!r}")
        normalize = self.encode_defaults.get("normalize", False) if normalize is None else bool(normalize)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"encode: batch_size must be a positive int, got {batch_size!r}")
        cfg = self.text_config
        width = self.text_embedding_dim if pooling == "model" and output == "dense" else cfg.hidden_size
        dimensions = check_dimensions("encode", dimensions, width)
        limit = max_length or self.encode_defaults.get("max_length") or cfg.max_position_embeddings
        device = next(self.parameters()).device
        if isinstance(inputs, torch.Tensor):
            seqs = None
            batches = [(inputs, attention_mask)]
            order = None
        else:
            if isinstance(inputs, str):
                inputs = [inputs]
            inputs = list(inputs)
            if inputs and all(isinstance(t, str) for t in inputs):
                seqs = self._tokenize(inputs, limit)
            elif all(isinstance(t, (list, tuple)) for t in inputs):
                seqs = [list(t) for t in inputs]
            else:
                raise TypeError("encode: inputs must be a str, a list of str, a list of token-id lists or a tensor")
            seqs = self._pad_tokenized(seqs, int(limit))
            order, batches = make_batches(seqs, batch_size)
        it = batches
        if show_progress and len(batches) > 1:
            from tqdm.auto import tqdm
            it = tqdm(batches, desc="encode", unit="batch")
        outs = []
        for ids, mask in it:
            ids = ids.to(device)
            mask = None if mask is None else mask.to(device)
            x, batch = self._encode(ids, mask, None)
            if output == "sparse":
                outs.extend(retrieval.sparse_rows(retrieval.sparse_weights(self, x, batch), top_k))
                continue
            if output == "multi_vector":
                outs.extend(retrieval.token_vectors(x, batch, proj, skip_first_token))
                continue
            if pooling == "model":
                emb = self.text_embedding(x, batch, ids, mask)
            else:
                emb = batch.mean(x) if pooling == "mean" else batch.first_tokens(x)
            outs.append(finish_embeddings(emb, normalize, dimensions))
        if output == "sparse":
            return retrieval.restore_order(outs, order)
        if output == "multi_vector":
            dim = cfg.hidden_size if proj is None else proj[0].shape[0]
            return retrieval.ragged(retrieval.restore_order(outs, order), dim, device)
        out = torch.cat(outs) if outs else torch.empty(0, dimensions or width, device=device)
        if order is not None:
            res = torch.empty_like(out)
            res[torch.tensor(order, device=out.device)] = out
            out = res
        return out
