"""The DeBERTa-v2/v3 encoder (He et al. 2020, 2021; model_type "deberta-v2") on packed tokens: its config, embeddings,
disentangled attention and blocks (the heads, the weight map and the architecture record: fastenc.models.deberta_v2).

Embeddings: word (+ absolute position when position_biased_input) (+ token type when type_vocab_size > 0) at
embedding_size, projected (no bias) to hidden_size when the two differ, LayerNorm, dropout. Blocks: BERT's post-norm
block (fastenc.models.bert.BertLayer.finish) over disentangled attention: with relative_attention, each score adds a
content-to-position (c2p) and a position-to-content (p2c) term read from the relative-position embeddings (`rel`,
LayerNorm-ed when norm_rel_ebd has "layer_norm"), the distance of a pair log-bucketed (position_buckets) as
transformers' make_log_bucket_position and clamped to the embeddings' span.

Attention, per layer (transformers' DisentangledSelfAttention, on packed tokens; q, k, v from one fused Wqkv GEMM):
  scale = 1 / sqrt(head_dim * (1 + number of terms in pos_att_type))
  pos_key = key projection of rel (share_att_key: key_proj itself, else pos_key_proj); pos_query likewise
  c2p[t, h, s] = q[t, h] . pos_key[s, h] * scale;  p2c[t, h, s] = k[t, h] . pos_query[s, h] * scale
  score(i, j) = scale * q_i . k_j + c2p[i, h, slot(i, j)] + p2c[j, h, slot(i, j)], slot from pos_i - pos_j
c2p / p2c are (tokens, heads, slots) and go to fastenc.ops.attention_qkv with the token positions (each token's
column in the padded batch, as transformers measures distances), which never forms a (seq, seq) tensor. Only the
slots the batch's widest row can reach are projected (slots = 2 * rel_span, rel_span <= the embeddings' span; see
`reach`). Extra memory per layer: c2p and p2c, tokens x heads x slots each when autograd records the call; in
inference, past 32 MiB of products, the heads run in groups whose products fit in qkv's size (`head_group`), made
and freed group by group.

Padded positions: transformers computes a state for each (its query sees every column with equal weight, the row's
mask being all False there); all padded positions of a row share it. The encoder carries one such state per row
beside the packed tokens when a head reads it (`_run(column0=True)` / `_run(padded=True)`): column 0 under
accelerate and in multiple choice (the ContextPooler reads column 0, padding or not) and the question-answering
loss (its softmax runs over every column). Attention-probability dropout is not applied to that state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from fastenc import extension, ops
from fastenc.layers import MLP, LayerNorm, Linear, SelfAttention
from fastenc.layers.dropout import dropout
from fastenc.layers.embedding import embedding, padding_row
from fastenc.layers.mlp import check_activation
from fastenc.models import bert
from fastenc.models.base import check_text_inputs, pack_text
from fastenc.models.config import _Common, _num_labels, _pick
from fastenc.reference.attention_relative import make_log_bucket_position

_TERMS = ("c2p", "p2c")


@dataclass
class DebertaV2Config(_Common):
    """DeBERTa-v2/v3 fields under transformers' names; defaults are transformers' DebertaV2Config's."""
    vocab_size: int = 128100
    hidden_size: int = 1536
    num_hidden_layers: int = 24
    num_attention_heads: int = 24
    intermediate_size: int = 6144
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 0
    layer_norm_eps: float = 1e-7
    relative_attention: bool = False
    max_relative_positions: int = -1
    position_buckets: int = -1
    pad_token_id: int = 0
    position_biased_input: bool = True
    pos_att_type: list = field(default_factory=list)
    share_att_key: bool = False
    norm_rel_ebd: str = "none"
    embedding_size: int | None = None
    pooler_dropout: float = 0.0
    pooler_hidden_act: str = "gelu"
    pooler_hidden_size: int | None = None
    cls_dropout: float | None = None
    legacy: bool = True
    model_type: str = "deberta-v2"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **override) -> "DebertaV2Config":
        """From a config.json dict; configs fastenc cannot serve are refused naming the field."""
        name = "DebertaV2Config"
        conv = d.get("conv_kernel_size") or 0
        if conv > 0:
            raise ValueError(f"{name}: conv_kernel_size must be 0 (the convolution layer after the first block is "
                             f"not supported), got {conv!r}")
        vals = _pick(cls, d, num_labels=_num_labels(d), **override)
        pat = vals.get("pos_att_type") or []
        if isinstance(pat, str):  # (transformers' older form "p2c|c2p")
            pat = [x.strip() for x in pat.lower().split("|")]
        bad = [t for t in pat if t not in _TERMS]
        if bad:
            raise ValueError(f"{name}: pos_att_type must list only 'c2p' and 'p2c', got {list(pat)!r}")
        vals["pos_att_type"] = list(pat)
        if vals.get("embedding_size") is None:
            vals["embedding_size"] = vals.get("hidden_size", cls.hidden_size)
        cfg = cls(**vals)
        cfg._check()
        head = d.get("attention_head_size")
        if head is not None and head != cfg.head_dim:
            raise ValueError(f"{name}: attention_head_size must be hidden_size / num_attention_heads = "
                             f"{cfg.head_dim}, got {head!r}")
        if cfg.pooler_hidden_size is not None and cfg.pooler_hidden_size != cfg.hidden_size:
            raise ValueError(f"{name}: pooler_hidden_size must equal hidden_size ({cfg.hidden_size}), got "
                             f"{cfg.pooler_hidden_size!r}")
        for f in ("embedding_size", "max_position_embeddings"):
            v = getattr(cfg, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: {f} must be a positive int, got {v!r}")
        if isinstance(cfg.type_vocab_size, bool) or not isinstance(cfg.type_vocab_size, int) or cfg.type_vocab_size < 0:
            raise ValueError(f"{name}: type_vocab_size must be an int >= 0, got {cfg.type_vocab_size!r}")
        if not cfg.legacy and cfg.embedding_size != cfg.hidden_size:
            raise ValueError(f"{name}: legacy=False (the lm_predictions head) needs embedding_size == hidden_size, got "
                             f"{cfg.embedding_size} and {cfg.hidden_size}")
        if cfg.relative_attention and cfg.position_buckets > 0 and cfg.max_relative - 1 <= cfg.position_buckets // 2:
            raise ValueError(f"{name}: position_buckets ({cfg.position_buckets}) needs max_relative_positions - 1 > "
                             f"position_buckets // 2 (log buckets), got max_relative_positions {cfg.max_relative}")
        check_activation(cfg.hidden_act)
        check_activation(cfg.pooler_hidden_act)
        cfg.hf_config = dict(d)
        return cfg

    @property
    def max_relative(self) -> int:
        """max_relative_positions as transformers resolves it (max_position_embeddings when < 1)."""
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

    @property
    def rel_span(self) -> int:
        """The relative embeddings' span (transformers' pos_ebd_size): 2 * rel_span rows."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative

    @property
    def rel_norm(self) -> bool:
        return "layer_norm" in [x.strip() for x in str(self.norm_rel_ebd).lower().split("|")]

    @property
    def scale_factor(self) -> int:
        """1 + the number of position terms in pos_att_type (counted with or without relative_attention)."""
        return 1 + sum(t in self.pos_att_type for t in _TERMS)

    @property
    def classifier_dropout(self) -> float | None:
        """The token classifier's dropout under BERT's name (None: hidden_dropout_prob, as transformers)."""
        return None

    def terms(self) -> tuple[bool, bool]:
        """(c2p, p2c): which disentangled terms the layers compute."""
        on = bool(self.relative_attention)
        return on and "c2p" in self.pos_att_type, on and "p2c" in self.pos_att_type


def _per_head(a: torch.Tensor, p: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[t, h, s] = a[t, h] . p[s, h], one matmul per head reading a's and p's views (unit last stride) and
    writing out's (tokens, slots) slice in place."""
    for h in range(a.shape[1]):
        torch.mm(a[:, h], p[:, h].t(), out=out[:, h])
    return out


def _in_place(a: torch.Tensor, p: torch.Tensor) -> bool:
    """Whether the per-head matmuls serve a x p: cpu tensors of one dtype, a with unit last stride, not traced."""
    return (a.device.type == "cpu" and p.device.type == "cpu" and not torch.compiler.is_compiling()
            and a.dtype == p.dtype and a.stride(2) == 1)


def _products(a: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """(tokens, heads, slots) contiguous: out[t, h, s] = a[t, h] . p[s, h]; a (tokens, heads, d) with unit last
    stride (a view into the fused qkv), p (slots, heads, d). On the cpu with grad mode off: one matmul per head
    reading a's view and writing its (tokens, slots) slice of out in place, out from fastenc's buffer cache when the
    extension is loaded (the next layer's products reuse these pages); else torch.einsum, whose batched matmul
    copies a per head and its result back (twice the time at DeBERTa-v3-base sizes). With grad mode on see
    _QKProducts (the products of a layer's q and k together)."""
    if torch.is_grad_enabled() or not _in_place(a, p):
        return torch.einsum("thd,shd->ths", a, p).contiguous()
    t, heads, _ = a.shape
    shape = (t, heads, p.shape[0])
    out = extension.buffer_empty(shape, a) if extension.loaded() else None
    if out is None:  # (no extension, or its buffer cache turned off)
        out = a.new_empty(shape)
    return _per_head(a, p, out)


class _QKProducts(torch.autograd.Function):
    """(c2p, p2c) = (q x pk, k x pq) per head, as _products, for a layer whose qkv autograd records: q, k the first
    two column blocks of qkv (tokens, 3 * hidden); pk, pq (slots, heads, d) or None (that term absent, its output
    None). Forward and backward are per-head matmuls on views, so neither q, k, the products nor their gradients
    are copied (einsum's batched matmul copies each per head); the backward writes d qkv's q and k blocks in place
    (the v block zero: autograd adds it to the attention's own d qkv), and d pk, d pq."""

    @staticmethod
    def forward(ctx, qkv: torch.Tensor, pk, pq, heads: int):
        t = qkv.shape[0]
        q, k, _ = qkv.view(t, 3, heads, -1).unbind(1)
        ctx.heads = heads
        ctx.save_for_backward(qkv, pk, pq)
        c2p = None if pk is None else _per_head(q, pk, q.new_empty((t, heads, pk.shape[0])))
        p2c = None if pq is None else _per_head(k, pq, k.new_empty((t, heads, pq.shape[0])))
        return c2p, p2c

    @staticmethod
    def backward(ctx, g_c2p, g_p2c):
        qkv, pk, pq = ctx.saved_tensors
        heads, t = ctx.heads, qkv.shape[0]
        d_qkv, d_p = None, [None, None]  # d qkv, [d pk, d pq]
        if ctx.needs_input_grad[0]:
            d_qkv = qkv.new_empty(qkv.shape)
            blocks = d_qkv.view(t, 3, heads, -1).unbind(1)
            blocks[2].zero_()
        q, k, _ = qkv.view(t, 3, heads, -1).unbind(1)
        for part, (a, p, g) in enumerate(((q, pk, g_c2p), (k, pq, g_p2c))):
            if p is None or g is None:
                if d_qkv is not None:
                    blocks[part].zero_()
                continue
            g = g if g.stride(2) == 1 else g.contiguous()
            if d_qkv is not None:
                for h in range(heads):
                    torch.mm(g[:, h], p[:, h], out=blocks[part][:, h])
            if ctx.needs_input_grad[1 + part]:
                d_p[part] = p.new_empty(p.shape)
                for h in range(heads):
                    torch.mm(g[:, h].t(), a[:, h], out=d_p[part][:, h])
        return d_qkv, d_p[0], d_p[1], None


def reach(cfg: DebertaV2Config, width: int) -> int:
    """The rel_span a batch of padded width `width` needs: the bucket of the longest distance (width - 1), plus one,
    capped at the embeddings' span. Slots beyond it are never read (slot = clamp(bucket + span, 0, 2 span - 1) is
    clamped nowhere below the cap, so trimming the same number of slots from each end changes no slot's row)."""
    span = cfg.rel_span
    far = width - 1
    if cfg.position_buckets > 0 and far > 0:
        far = int(make_log_bucket_position(torch.tensor(far), cfg.position_buckets, cfg.max_relative))
    return max(1, min(span, far + 1))


class DebertaV2Embeddings(nn.Module):
    """word (+ position) (+ token type) at embedding_size, `project` (no bias) to hidden_size when they differ,
    LayerNorm, dropout. forward(ids, positions, types): packed (tokens,) -> (tokens, hidden)."""

    def __init__(self, cfg: DebertaV2Config):
        super().__init__()
        e, h = cfg.embedding_size, cfg.hidden_size
        self.word = nn.Embedding(cfg.vocab_size, e)
        self.position = nn.Embedding(cfg.max_position_embeddings, e) if cfg.position_biased_input else None
        self.token_type = nn.Embedding(cfg.type_vocab_size, e) if cfg.type_vocab_size > 0 else None
        self.project = Linear(e, h, bias=False) if e != h else None
        self.norm = LayerNorm(h, cfg.layer_norm_eps)
        self.dropout = cfg.hidden_dropout_prob
        self.pad = padding_row(cfg.pad_token_id, cfg.vocab_size)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, types: torch.Tensor | None) -> torch.Tensor:
        x = embedding(ids, self.word.weight, padding_idx=self.pad)
        if self.position is not None:
            x = x + F.embedding(positions, self.position.weight)
        if self.token_type is not None:
            x = x + (self.token_type.weight[0] if types is None else F.embedding(types, self.token_type.weight))
        if self.project is not None:
            x = self.project(x)
        x = self.norm(x)
        return dropout(x, self.dropout) if self.training and self.dropout > 0 else x


class DisentangledAttention(SelfAttention):
    """SelfAttention's fused Wqkv and Wo, plus pos_key (c2p) / pos_query (p2c) projections of the relative
    embeddings when share_att_key is off (with it, the key and query thirds of Wqkv project them)."""

    def __init__(self, cfg: DebertaV2Config):
        super().__init__(cfg.hidden_size, cfg.num_attention_heads, bias=True,
                         dropout=cfg.attention_probs_dropout_prob)
        h = cfg.hidden_size
        self.c2p, self.p2c = cfg.terms()
        self.share = bool(cfg.share_att_key)
        self.pos_key = Linear(h, h) if self.c2p and not self.share else None
        self.pos_query = Linear(h, h) if self.p2c and not self.share else None
        self.scale = 1.0 / math.sqrt(self.head_dim * cfg.scale_factor)
        self.rel_dropout = cfg.hidden_dropout_prob
        self.buckets, self.max_relative = cfg.position_buckets, cfg.max_relative

    def _shared(self, rel: torch.Tensor, part: int) -> torch.Tensor:
        """Wqkv's query (part 0) or key (part 1) projection of rel (slots, hidden)."""
        h, w = self.hidden, self.Wqkv
        if type(w) is Linear and w.int8 is None:
            b = None if w.bias is None else w.bias[part * h:(part + 1) * h]
            return F.linear(rel, w.weight[part * h:(part + 1) * h], b)
        return w(rel)[:, part * h:(part + 1) * h]  # (an adapter or int8 weights: the module's own forward)

    def rel_keys(self, rel: torch.Tensor):
        """(pos_key, pos_query), each (slots, heads, head_dim) pre-multiplied by scale, or None for an absent term:
        the projections of rel (slots, hidden) the c2p / p2c products read."""
        if self.training and self.rel_dropout > 0:
            rel = F.dropout(rel, self.rel_dropout, training=True)
        s, heads, d = rel.shape[0], self.heads, self.head_dim
        pk = pq = None
        if self.c2p:
            pk = ((self._shared(rel, 1) if self.share else self.pos_key(rel)) * self.scale).view(s, heads, d)
        if self.p2c:
            pq = ((self._shared(rel, 0) if self.share else self.pos_query(rel)) * self.scale).view(s, heads, d)
        return pk, pq

    def attend_rel(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, positions: torch.Tensor | None,
                   rel: torch.Tensor | None, rel_span: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention output before Wo (tokens, hidden), v (tokens, hidden)). positions (tokens,) int64: each
        token's padded column; rel (2 * rel_span, hidden): the relative embeddings' middle rows, or None.
        With grad mode off the heads run in groups of head_group(...) (one attention call and one pair of c2p / p2c
        products per group), so the products held at once are at most qkv's size or GROUP_FROM_BYTES, whatever the
        slot count."""
        t = x.shape[0]
        qkv = self.Wqkv(x)
        p = self.dropout if self.training else 0.0
        kw: dict = {"dropout_p": p} if p > 0 else {}
        if rel is not None and (self.c2p or self.p2c):
            kw.update(rel_span=rel_span, position_buckets=self.buckets, max_relative_positions=self.max_relative,
                      positions=positions)
            heads, d = self.heads, self.head_dim
            q, k, v = qkv.view(t, 3, heads, d).unbind(1)
            pk, pq = self.rel_keys(rel)
            g = heads if torch.is_grad_enabled() else head_group(heads, d, rel.shape[0], self.c2p + self.p2c, t,
                                                                 qkv.element_size())
            if g < heads:
                o = qkv.new_empty((t, heads, d))
                for h0 in range(0, heads, g):
                    hs = slice(h0, min(h0 + g, heads))
                    c2p = None if pk is None else _products(q[:, hs], pk[:, hs])
                    p2c = None if pq is None else _products(k[:, hs], pq[:, hs])
                    o[:, hs] = ops.attention(q[:, hs], k[:, hs], v[:, hs], cu_seqlens=cu_seqlens,
                                             max_seqlen=max_seqlen, scale=self.scale, c2p=c2p, p2c=p2c, **kw)
                    del c2p, p2c  # (freed before the next group's products are made)
                return o.view(t, self.hidden), qkv.view(t, 3, self.hidden)[:, 2]
            if torch.is_grad_enabled() and all(_in_place(a, b) for a, b in ((q, pk), (k, pq)) if b is not None):
                c2p, p2c = _QKProducts.apply(qkv, pk, pq, heads)
            else:
                c2p = None if pk is None else _products(q, pk)
                p2c = None if pq is None else _products(k, pq)
            kw.update(c2p=c2p, p2c=p2c)
        o = ops.attention_qkv(qkv, self.heads, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, scale=self.scale, **kw)
        return o.reshape(t, self.hidden), qkv.view(t, 3, self.hidden)[:, 2]


GROUP_FROM_BYTES = 32 << 20  # all heads' products up to this size run in one call (head_group)


def head_group(heads: int, head_dim: int, slots: int, terms: int, tokens: int = 0, itemsize: int = 4) -> int:
    """Heads per attention call in inference: all of them while their c2p / p2c products (terms x slots values per
    token and head, `itemsize` bytes each) take at most GROUP_FROM_BYTES; past that the most heads whose products
    fit in qkv's size (3 x heads x head_dim per token), at least one. (A group's products are freed before the
    next group's are made, and are read while still in cache; each group is one more attention call.)"""
    if tokens * heads * slots * terms * itemsize <= GROUP_FROM_BYTES:
        return heads
    return max(1, min(heads, (3 * heads * head_dim) // max(1, terms * slots)))


class DebertaV2Layer(bert.BertLayer):
    """BERT's post-norm block (finish(): LN(x + drop(Wo o)), LN(. + drop(mlp(.)))) over disentangled attention."""

    def __init__(self, cfg: DebertaV2Config):
        nn.Module.__init__(self)
        h = cfg.hidden_size
        self.dropout = cfg.hidden_dropout_prob
        self.attn = DisentangledAttention(cfg)
        self.attn_norm = LayerNorm(h, cfg.layer_norm_eps)
        self.mlp = MLP(h, cfg.intermediate_size, cfg.hidden_act)
        self.mlp_norm = LayerNorm(h, cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, positions, rel, rel_span: int,
                pads=None):
        """x (tokens, hidden) -> (x', pad state'): x is overwritten unless autograd records the call or dropout is
        on. pads: None, or (state (batch, hidden), seg (tokens,) row of each token, n_pad (batch, 1), width): the
        padded positions' shared state per row, which attends to every column of its row with weight 1 / width
        (transformers' fully masked query row)."""
        o, v = self.attn.attend_rel(x, cu_seqlens, max_seqlen, positions, rel, rel_span)
        state = None
        if pads is not None:
            state, seg, n_pad, width = pads
            h = self.attn.hidden
            vp = self.attn.Wqkv(state)[:, 2 * h:]
            acc = torch.zeros(state.shape, dtype=torch.float32, device=x.device).index_add(0, seg, v.float())
            state = self.finish(((acc + n_pad * vp.float()) / width).to(x.dtype), state)
        return self.finish(o, x), state


class DebertaV2Encoder(bert.BertModel):
    """The encoder every DeBERTa-v2 class runs: embeddings, the relative embeddings (rel, rel_norm) and the
    disentangled blocks; no pooler."""
    task = "base"
    pools_column0 = False  # (accelerate: each class's own forward or hf_forward reads column 0 as transformers)

    def __init__(self, config: DebertaV2Config):
        nn.Module.__init__(self)
        self.config = config
        self.embeddings = DebertaV2Embeddings(config)
        rel = config.relative_attention
        self.rel = nn.Embedding(2 * config.rel_span, config.hidden_size) if rel else None
        self.rel_norm = LayerNorm(config.hidden_size, config.layer_norm_eps) if rel and config.rel_norm else None
        self.layers = nn.ModuleList(DebertaV2Layer(config) for _ in range(config.num_hidden_layers))
        self.pooler = None

    def _run(self, input_ids, attention_mask=None, token_type_ids=None, column0: bool = False, padded: bool = False,
             first_only: bool = False):
        """(x (total, hidden), PackedBatch, extra), as BertModel._run: extra is column 0's state per row (column0:
        the first token's, or where column 0 is padding the row's padded state as transformers computes it),
        (rows, cols, states) of every padded position (padded; None without padding), or None. first_only: x is
        each sequence's first real token (batch, hidden)."""
        cfg = self.config
        input_ids, mask, types = check_text_inputs(
            type(self).__name__, input_ids, attention_mask, token_type_ids, cfg.vocab_size,
            cfg.max_position_embeddings if cfg.position_biased_input else None,
            cfg.type_vocab_size if cfg.type_vocab_size > 0 else None)
        batch, ids, pos = pack_text(input_ids, mask)
        packed_types = None
        if types is not None and cfg.type_vocab_size > 0:
            packed_types = batch.gather(types.to(input_ids.device))
        x = self.embeddings(ids, pos, packed_types)
        rel, span = None, 0
        if self.rel is not None:
            span = reach(cfg, batch.seq)
            full = cfg.rel_span
            rel = self.rel.weight[full - span:full + span]
            if self.rel_norm is not None:
                rel = self.rel_norm(rel)
        pads = None
        want = (column0 or padded) and mask is not None and not bool(mask.all())
        if want:
            seg = torch.repeat_interleave(torch.arange(batch.batch, device=x.device), batch.seqlens(),
                                          output_size=batch.total)
            n_pad = (batch.seq - batch.seqlens()).to(torch.float32)[:, None]
            pads = [x.new_zeros(batch.batch, cfg.hidden_size), seg, n_pad, batch.seq]
        for layer in self.layers:
            x, state = layer(x, batch.cu_seqlens, batch.max_seqlen, pos, rel, span,
                             None if pads is None else tuple(pads))
            if pads is not None:
                pads[0] = state
        if first_only and not (column0 or padded):
            return batch.first_tokens(x), batch, None
        if padded:
            if pads is None:
                return x, batch, None
            rows, cols = (~mask).nonzero(as_tuple=True)
            return x, batch, (rows, cols, pads[0].index_select(0, rows))
        first = None
        if column0:
            first = batch.first_tokens(x)
            if pads is not None:
                first = torch.where(mask[:, :1].to(first.device), first, pads[0].to(first.dtype))
        return x, batch, first
