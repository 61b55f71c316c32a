"""MPNet (Song et al. 2020) on packed tokens: RoBERTa's embeddings (word + position, no token types; positions from
the ids with padding_idx 1), BERT's post-LayerNorm blocks (one fused QKV GEMM) and T5's bucketed relative-position
bias, one (num_buckets, heads) table `relative_bias` (transformers' encoder.relative_attention_bias) shared by every
layer and added to each layer's scaled scores inside the attention kernels (fastenc.ops.attention's
relative_bias= with 32 buckets and max distance 128, exactly transformers' MPNetEncoder.relative_position_bucket;
the table's gradient comes from the kernels' lookup gradient).

transformers builds the relative positions from arange over the padded row (compute_position_bias), so distances
are padded-column distances. Right or left padding keeps each row's real tokens one contiguous run, where they equal
the distances within the packed sequence; a mask with holes (a row not one run) passes each token's padded column
to the attention ops as its position (`positions=`). compute_position_bias uses its default num_buckets=32 whatever
config.relative_attention_num_buckets says: the first 32 rows of the table are read (the config must hold >= 32).

Usage: fastenc.from_hf(hf_mpnet) / fastenc.from_pretrained(folder) (MPNetModel and the heads below), or
  MPNetModel(MPNetConfig(...)).
  model(input_ids, attention_mask=None) -> (batch, seq, hidden), zeros at padding (token_type_ids must be None).
Heads (transformers' names):
  MPNetForSequenceClassification  out_proj(drop(tanh(dense(drop(<s>))))) -> (batch, num_labels); no pooler
  MPNetForTokenClassification     classifier(drop(hidden)) -> (batch, seq, num_labels)
  MPNetForQuestionAnswering       qa_outputs(hidden) -> (start_logits, end_logits), each (batch, seq)
  MPNetForMaskedLM                layer_norm(gelu(dense(hidden))) @ word_embedding^T + bias -> vocab logits (exact
                                  GELU whatever hidden_act is, as transformers' MPNetLMHead)
  MPNetForMultipleChoice          classifier(drop(tanh(pooler(column 0)))) per choice -> (batch, choices)
Dropouts as transformers': embeddings, attention probabilities, attention and MLP outputs (hidden_dropout_prob /
attention_probs_dropout_prob), the heads' hidden_dropout_prob.
Parameter names (fastenc side of `weight_map`): embeddings.{word,position}.weight, embeddings.norm.*, relative_bias,
layers.i.{attn.Wqkv,attn.Wo,attn_norm,mlp.fc1,mlp.fc2,mlp_norm}.*, pooler.*, classifier.*, qa_outputs.*,
lm_head.{dense,layer_norm}.*, lm_head.bias.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from fastenc import ops
from fastenc.layers import LayerNorm, Linear, SelfAttention
from fastenc.layers.dropout import dropout
from fastenc.layers.embedding import embedding
from fastenc.models import bert, losses, roberta
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.base import check_text_inputs, pack_text
from fastenc.models.bert_direct import direct_block, direct_linears
from fastenc.models.columns import _project, padded_first_rows, padded_positions, rows_with_holes
from fastenc.models.config import BertConfig
from fastenc.models.convert import Entry, lin, qkv
from fastenc.models.multiple_choice import MultipleChoice
from fastenc.ops._common import needs_grad
from fastenc.ops.direct import Plan
from fastenc.padding import gather_rows
from fastenc.reference.attention_bias import distance_bias

PADDING_IDX = 1  # transformers' MPNetEmbeddings.padding_idx, fixed whatever pad_token_id says
NUM_BUCKETS = 32  # the num_buckets MPNetEncoder.compute_position_bias uses (its default; the config's is not passed)
MAX_DISTANCE = 128  # MPNetEncoder.relative_position_bucket's max_distance


@dataclass
class MPNetConfig(BertConfig):
    """BERT's fields with MPNet's defaults (transformers' MPNetConfig), no token types, plus the relative-position
    table's row count."""
    vocab_size: int = 30527
    max_position_embeddings: int = 512
    type_vocab_size: int = 1  # (unused: MPNet has no token-type embeddings)
    pad_token_id: int = 1
    relative_attention_num_buckets: int = 32
    model_type: str = "mpnet"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **override) -> "MPNetConfig":
        cfg = super().from_dict(d, **override)
        nb = cfg.relative_attention_num_buckets
        if isinstance(nb, bool) or not isinstance(nb, int) or nb < NUM_BUCKETS:
            raise ValueError(f"MPNetConfig: relative_attention_num_buckets must be an int >= {NUM_BUCKETS} (transformers' "
                             f"MPNet reads buckets 0..{NUM_BUCKETS - 1} of the table), got {nb!r}")
        return cfg

    @property
    def max_tokens(self) -> int:
        """The most tokens a row can hold: positions run from padding_idx + 1 to max_position_embeddings - 1."""
        return self.max_position_embeddings - PADDING_IDX - 1


class MPNetEmbeddings(nn.Module):
    """LN(word[ids] + position[positions]), then dropout; both tables' row padding_idx (1) gets no gradient, as
    transformers' nn.Embedding(padding_idx=1). forward(ids, positions): packed (tokens,) -> (tokens, hidden)."""

    def __init__(self, cfg: MPNetConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.dropout = cfg.hidden_dropout_prob
        self.pad = PADDING_IDX if cfg.vocab_size > PADDING_IDX else None
        self.pos_pad = PADDING_IDX if cfg.max_position_embeddings > PADDING_IDX else None

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = embedding(ids, self.word.weight, padding_idx=self.pad)
        x = self.norm(F.embedding(positions, self.position.weight, padding_idx=self.pos_pad), residual=x,
                      return_residual=False)
        return dropout(x, self.dropout) if self.training and self.dropout > 0 else x


class _RelativePlan(Plan):
    """A forward's inference Plan (fastenc.ops.direct) whose attention adds the distance lookup `lut`
    (heads, 2 * max_seqlen - 1), built once per forward from the relative-position table: the cpu kernel reads it
    (the same kernel and lookup fastenc.ops.attention runs with relative_bias=)."""

    __slots__ = ("lut", "positions")

    def __init__(self, plan: Plan, lut: torch.Tensor, positions: torch.Tensor | None = None):
        super().__init__(plan.ext, plan.cu_seqlens, plan.max_seqlen, plan.record)
        self.lut, self.positions = lut, positions

    @staticmethod
    def make(plan: Plan, table: torch.Tensor, positions: torch.Tensor | None) -> "_RelativePlan":
        """plan with the lookup of `table` (NUM_BUCKETS, heads) for L = max(longest, positions.max() + 1) and the
        tokens' positions (int (tokens,) padded columns, or None: the index within each sequence)."""
        n = plan.max_seqlen
        if positions is not None:
            positions = positions.to(torch.int32).contiguous()
            n = max(n, int(positions.max()) + 1 if positions.numel() else 0)
        return _RelativePlan(plan, distance_bias(n, table.detach(), MAX_DISTANCE), positions)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window=None) -> torch.Tensor:
        if window is not None:
            raise ValueError(f"MPNet attention: window must be None (global attention), got {window!r}")
        extra = {} if self.positions is None else {"positions": self.positions}  # (the kernel checks each in [0, L))
        with self._named("fastenc::attention"):
            return self.ext.attention(q, k, v, self.cu_seqlens, self.max_seqlen, -1, -1,
                                      1.0 / math.sqrt(q.shape[-1]), 0.0, 0, 0, bias=self.lut, **extra)[0]


class MPNetAttention(SelfAttention):
    """SelfAttention (fused Wqkv, Wo) whose scores get the relative-position bias: attend(..., table=, positions=)
    with table (NUM_BUCKETS, heads) fp32 (fastenc.ops.attention's relative_bias) and positions None (the index within
    each sequence) or int (tokens,) (each token's padded column: rows with holes)."""

    def attend(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, rope=None, plan=None, *,
               table: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The attention output before Wo: (tokens, hidden). plan: a _RelativePlan (its lookup is the table's) or
        None (the public ops, relative_bias=table)."""
        if rope is not None:
            raise ValueError("MPNetAttention: rope must be None (MPNet has no rotary positions)")
        if plan is not None:
            if not isinstance(plan, _RelativePlan):
                raise ValueError("MPNetAttention: plan must be a _RelativePlan (the lookup and positions its own)")
            return super().attend(x, cu_seqlens, max_seqlen, plan=plan)
        if table is None:
            raise ValueError("MPNetAttention: table (the relative-position bias, (32, heads) fp32) is required")
        t = x.shape[0]
        rel = {"relative_bias": table, "relative_max_distance": MAX_DISTANCE}
        if positions is not None:
            rel["positions"] = positions
        if (x.device.type == "cpu" and type(self.Wqkv) is Linear
                and not needs_grad(x, self.Wqkv.weight, self.Wqkv.bias, table)):
            # inference: q, k, v as three contiguous planes of one buffer (SelfAttention.attend's cpu path)
            q, k, v = (u.view(t, self.heads, self.head_dim) for u in self.Wqkv.planes(x, 3))
            o = ops.attention(q, k, v, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, **rel)
            return o.reshape(t, self.hidden)
        p = self.dropout if self.training else 0.0
        if p > 0:
            rel["dropout_p"] = p
        return ops.attention_qkv(self.Wqkv(x), self.heads, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                                 **rel).reshape(t, self.hidden)


class MPNetLayer(bert.BertLayer):
    """BERT's post-norm block (its inference forms included: in-place residual adds, the direct kernel sequence under
    a Plan) with MPNetAttention. forward(x, cu_seqlens, max_seqlen, rows=None, plan=None, *, table, positions=None);
    rows: attention over every token, the rest of the block at those rows only (first-token heads)."""

    def __init__(self, cfg: MPNetConfig):
        super().__init__(cfg)
        self.attn = MPNetAttention(cfg.hidden_size, cfg.num_attention_heads, bias=True,
                                   dropout=cfg.attention_probs_dropout_prob)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, rows: torch.Tensor | None = None,
                plan: Plan | None = None, *, table: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        if rows is not None:
            o = self.attn.attend(x, cu_seqlens, max_seqlen, table=table, positions=positions)
            return self.finish(gather_rows(o, rows), gather_rows(x, rows))
        if plan is not None and not plan.record:
            lins = direct_linears(self, x)
            if lins is not None:
                return direct_block(self, x, plan, lins)
        return self.finish(self.attn.attend(x, cu_seqlens, max_seqlen, plan=plan, table=table, positions=positions),
                           x, plan)


def column_attention(attn: MPNetAttention, xq: torch.Tensor, q_rows: torch.Tensor, q_cols: torch.Tensor,
                     x: torch.Tensor, cu_seqlens: torch.Tensor, k_cols: torch.Tensor, lut: torch.Tensor,
                     seq: int | None = None, budget: int = 1 << 24) -> torch.Tensor:
    """Attention output before Wo for padded queries (transformers computes one at every padded position; its
    poolers read column 0 even when it is padding): each sees the real tokens of its row and is no key itself.

    xq: (n, hidden) the queries' inputs; q_rows, q_cols: (n,) int their batch row and padded column; x: (total,
    hidden) the packed tokens' inputs to the same layer; k_cols: (total,) int each packed token's padded column;
    lut: (heads, 2 L - 1) fp32 distance lookup with L >= the padded width (distance_bias of the table).
      scores = (q . k) / sqrt(head_dim) + lut[h, q_col - k_col + L - 1] over the row's real keys; softmax; @ v
    fp32 math, queries in chunks of at most `budget` fp32 score elements. A query whose row has no real token gets
    zeros, or with seq (the padded width; the queries are then every position of such a row) the mean of v over
    the row's seq columns, transformers' uniform softmax over a row masked everywhere. Returns (n, hidden) in x's
    dtype."""
    h, heads, d = attn.hidden, attn.heads, attn.head_dim
    n, t, dev = xq.shape[0], x.shape[0], x.device
    if n == 0:
        return x.new_zeros(0, h)
    cu = cu_seqlens.long()
    start = cu[q_rows]
    length = cu[q_rows + 1] - start
    lk = max(int(length.max()), 1)
    ar = torch.arange(lk, device=dev)
    seen = ar[None, :] < length[:, None]  # (n, lk)
    kidx = (start[:, None] + ar[None, :]).clamp(0, max(t - 1, 0))
    q = _project(attn.Wqkv, xq, 0, h).float().view(n, heads, d)
    kv = _project(attn.Wqkv, x, h, 3 * h).float().view(t, 2, heads, d) if t else None
    n_lut = (lut.shape[1] + 1) // 2
    out = torch.zeros(n, heads, d, dtype=torch.float32, device=dev)
    step = max(1, budget // (heads * lk * max(d, 1)))
    for c in range(0, n, step):
        if kv is None:
            break
        sl = slice(c, c + step)
        kg = kv.index_select(0, kidx[sl].flatten()).view(-1, lk, 2, heads, d)
        s = torch.einsum("mhd,mlhd->mhl", q[sl], kg[:, :, 0]) / math.sqrt(d)
        dist = q_cols[sl, None].long() - k_cols.long()[kidx[sl]]  # query column - key column
        s = s + lut[:, (dist + n_lut - 1).clamp(0, 2 * n_lut - 2)].permute(1, 0, 2).to(s.dtype)
        s = s.masked_fill(~seen[sl, None, :], float("-inf"))
        blind = ~seen[sl].any(1)
        p = torch.softmax(s.masked_fill(blind[:, None, None], 0.0), dim=-1)
        out[sl] = torch.einsum("mhl,mlhd->mhd", p, kg[:, :, 1]).masked_fill(blind[:, None, None], 0.0)
    blind = length == 0
    if seq is not None and bool(blind.any()):  # the mean of v over the row's columns, every one a query here
        vq = _project(attn.Wqkv, xq, 2 * h, 3 * h).float().view(n, heads, d)
        rows, slot = torch.unique(q_rows, return_inverse=True)
        mean = torch.zeros(rows.numel(), heads, d, device=dev).index_add(0, slot, vq) / seq
        out = torch.where(blind[:, None, None], mean[slot], out)
    return out.reshape(n, h).to(x.dtype)


class MPNetModel(bert.BertModel):
    """The encoder (with the tanh pooler when the checkpoint has one): MPNetEmbeddings, MPNetLayers, the shared
    relative-position table `relative_bias` (num_buckets, heads)."""
    task = "base"

    def __init__(self, config: MPNetConfig):
        nn.Module.__init__(self)  # (BertModel's modules with MPNet's embeddings, blocks and table)
        self.config = config
        self.embeddings = MPNetEmbeddings(config)
        self.layers = nn.ModuleList(MPNetLayer(config) for _ in range(config.num_hidden_layers))
        self.relative_bias = nn.Parameter(torch.zeros(config.relative_attention_num_buckets,
                                                      config.num_attention_heads))
        self.pooler = Linear(config.hidden_size, config.hidden_size) if config.add_pooling_layer else None

    def relative_table(self) -> torch.Tensor:
        """The (NUM_BUCKETS, heads) fp32 table the attention ops read (the first 32 rows, as transformers)."""
        t = self.relative_bias[:NUM_BUCKETS]
        return t if t.dtype == torch.float32 else t.float()

    def _positions(self, input_ids, batch, ids, pos, rows, cols):
        """RoBERTa's position ids with padding_idx 1 (transformers' create_position_ids_from_input_ids): packed
        (total,) and the padded queries' (n,) (None without), checked against the position table."""
        real = input_ids != PADDING_IDX
        grid = real.cumsum(1) * real + PADDING_IDX
        at = batch.gather(grid)
        if at.numel():
            hi = int(at.max())
            if hi >= self.config.max_position_embeddings:
                raise ValueError(f"{type(self).__name__}: input_ids has a row of {hi - PADDING_IDX} tokens that are "
                                 f"not padding (id {PADDING_IDX}); position ids start at {PADDING_IDX + 1}, so the "
                                 f"position table (max_position_embeddings={self.config.max_position_embeddings}) "
                                 f"holds at most {self.config.max_tokens}")
        return at, None if rows is None else grid[rows, cols]

    def load_tokenizer(self, folder) -> None:
        super().load_tokenizer(folder)
        if not self.encode_defaults.get("max_length"):  # truncate to what the position table holds
            object.__setattr__(self, "encode_defaults", {**self.encode_defaults, "max_length": self.config.max_tokens})

    def _run(self, input_ids, attention_mask=None, token_type_ids=None, column0: bool = False, padded: bool = False,
             first_only: bool = False):
        """BertModel._run's contract: (x (total, hidden), PackedBatch, first); first is column 0's state per row
        (column0), (rows, cols, states) of every padded position (padded), or None; first_only: x is (batch, hidden),
        each sequence's first real token, the last layer past attention at those rows only. Padded queries see the
        relative bias at padded-column distances (column_attention)."""
        cfg, name = self.config, type(self).__name__
        if token_type_ids is not None:
            raise ValueError(f"{name}: token_type_ids must be None (MPNet has no token-type embeddings), got a "
                             f"{type(token_type_ids).__name__}")
        input_ids, mask, _ = check_text_inputs(name, input_ids, attention_mask, None, cfg.vocab_size,
                                               cfg.max_position_embeddings)
        batch, ids, pos = pack_text(input_ids, mask)
        # rows with holes: each token's padded column is its position for the bias (transformers' padded arange)
        positions = pos if rows_with_holes(mask) is not None else None
        rows, cols = padded_positions(mask) if padded else (padded_first_rows(mask) if column0 else None, None)
        if rows is not None:
            cols = torch.zeros_like(rows) if cols is None else cols
        at, at_queries = self._positions(input_ids, batch, ids, pos, rows, cols)
        x = self.embeddings(ids, at)
        layers = self.blocks()
        table = self.relative_table()
        kw = {"table": table, "positions": positions}
        plan = bert._plan(layers, x, batch.cu_seqlens)
        if plan is not None:  # (inference only: the lookup is built without autograd)
            plan = _RelativePlan.make(plan, table, positions)
        if first_only and not (column0 or padded):
            if not len(layers) or batch.total == 0:
                for layer in layers:
                    x = layer(x, batch.cu_seqlens, batch.max_seqlen, plan=plan, **kw)
                return batch.first_tokens(x), batch, None
            for layer in layers[:-1]:
                x = layer(x, batch.cu_seqlens, batch.max_seqlen, plan=plan, **kw)
            first = layers[-1](x, batch.cu_seqlens, batch.max_seqlen, rows=batch.first_rows(), **kw)
            empty = batch.seqlens() == 0
            return (first.masked_fill(empty[:, None], 0) if bool(empty.any()) else first), batch, None
        xg = lut = None
        if rows is not None:  # the padded queries (column 0 or all), run beside the packed tokens
            xg = self.embeddings(input_ids[rows, cols], at_queries)
            lut = distance_bias(input_ids.shape[1], table, MAX_DISTANCE)
        for layer in layers:
            if rows is not None:  # (before `layer` overwrites x)
                o = column_attention(layer.attn, xg, rows, cols, x, batch.cu_seqlens, pos, lut,
                                     input_ids.shape[1] if padded else None)
                xg = layer.finish(o, xg)
            x = layer(x, batch.cu_seqlens, batch.max_seqlen, plan=plan, **kw)
        if padded:
            return x, batch, None if rows is None else (rows, cols, xg)
        first = None
        if column0:
            first = batch.first_tokens(x)
            if rows is not None:
                first = first.index_copy(0, rows, xg.to(first.dtype))
        return x, batch, first


class MPNetForSequenceClassification(MPNetModel):
    """logits = out_proj(drop(tanh(dense(drop(first real token))))): (batch, num_labels) (column 0 under
    accelerate, as transformers), no pooler. labels= (batch,) int / float (fastenc.models.losses) ->
    SequenceClassifierOutput(loss, logits)."""
    task = "sequence_classification"
    classify = roberta.RobertaForSequenceClassification.classify
    forward = roberta.RobertaForSequenceClassification.forward

    def __init__(self, config: MPNetConfig):
        super().__init__(dataclasses.replace(config, add_pooling_layer=False))
        self.classifier = roberta.RobertaClassificationHead(self.config)


class MPNetForTokenClassification(MPNetModel):
    """logits = classifier(drop(hidden)): (batch, seq, num_labels), zeros at padded positions. labels= as
    BertForTokenClassification."""
    task = "token_classification"
    forward = bert.BertForTokenClassification.forward

    def __init__(self, config: MPNetConfig):
        super().__init__(dataclasses.replace(config, add_pooling_layer=False))
        self.classifier = Linear(config.hidden_size, config.num_labels)


class MPNetForQuestionAnswering(MPNetModel):
    """(start_logits, end_logits) = qa_outputs(hidden) split in two: each (batch, seq), zeros at padded positions.
    start_positions= / end_positions= int (batch,) -> QuestionAnsweringModelOutput with transformers' loss, whose
    softmax runs over the padded columns too (their logits computed as transformers does)."""
    task = "question_answering"

    def __init__(self, config: MPNetConfig):
        losses.check_qa_labels_count(type(self).__name__, config)
        super().__init__(dataclasses.replace(config, add_pooling_layer=False))
        self.qa_outputs = Linear(config.hidden_size, 2)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None, end_positions=None):
        return bert.question_answering(self, input_ids, attention_mask, token_type_ids, start_positions,
                                       end_positions)


class MPNetForMaskedLM(MPNetModel):
    """Masked-LM logits = lm_head(hidden) with the decoder tied to embeddings.word, computed only where needed
    (BertForMaskedLM's forward: positions= -> (n, vocab) there; labels= -> MaskedLMOutput(loss, logits at the
    labelled tokens); neither -> (batch, seq, vocab), zeros at padding). hf_forward gives transformers' shapes."""
    task = "masked_lm"
    forward = bert.BertForMaskedLM.forward
    hf_forward = bert.BertForMaskedLM.hf_forward

    def __init__(self, config: MPNetConfig):
        losses.check_tied(type(self).__name__, config)
        super().__init__(dataclasses.replace(config, add_pooling_layer=False))
        self.lm_head = roberta.RobertaLMHead(self.config)

    @property
    def decoder_weight(self) -> nn.Parameter:
        return self.embeddings.word.weight

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """(n, hidden) packed hidden states -> (n, vocab) logits."""
        return self.lm_head(x, self.decoder_weight)

    def mlm_projection(self, x: torch.Tensor):
        """(transformed (n, hidden), decoder weight (vocab, hidden), decoder bias (vocab,)): predict(x) is
        transformed @ weight^T + bias (encode(output='sparse') fuses that product with its max)."""
        return self.lm_head.transform(x), self.decoder_weight, self.lm_head.bias


class MPNetForMultipleChoice(MultipleChoice, MPNetModel):
    """input_ids (batch, choices, seq) (attention_mask alike) -> logits (batch, choices): classifier(drop(tanh(
    pooler(column 0)))) per choice, column 0 read as transformers does (padding or not), dropout
    hidden_dropout_prob. labels= int (batch,) -> MultipleChoiceModelOutput(loss, logits)."""
    needs_pooler = True


def weight_map(cfg: MPNetConfig, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every MPNet tensor (prefix "mpnet." inside the head classes). The
    masked-LM decoder is the word embedding and lm_head.bias: transformers' state_dict repeats them as
    lm_head.decoder.*, its checkpoints do not, so the map lists them once, under the names the checkpoint stores."""
    p = prefix
    m: list[Entry] = [
        ("embeddings.word.weight", (f"{p}embeddings.word_embeddings.weight",), "copy"),
        ("embeddings.position.weight", (f"{p}embeddings.position_embeddings.weight",), "copy"),
        *lin("embeddings.norm", f"{p}embeddings.LayerNorm"),
        ("relative_bias", (f"{p}encoder.relative_attention_bias.weight",), "copy"),
    ]
    for i in range(cfg.num_hidden_layers):
        f, h = f"layers.{i}", f"{p}encoder.layer.{i}"
        m += qkv(f"{f}.attn.Wqkv", tuple(f"{h}.attention.attn.{n}" for n in ("q", "k", "v")))
        m += lin(f"{f}.attn.Wo", f"{h}.attention.attn.o")
        m += lin(f"{f}.attn_norm", f"{h}.attention.LayerNorm")
        m += lin(f"{f}.mlp.fc1", f"{h}.intermediate.dense")
        m += lin(f"{f}.mlp.fc2", f"{h}.output.dense")
        m += lin(f"{f}.mlp_norm", f"{h}.output.LayerNorm")
    if cfg.add_pooling_layer:
        m += lin("pooler", f"{p}pooler.dense")
    if task == "sequence_classification":
        m += lin("classifier.dense", "classifier.dense") + lin("classifier.out_proj", "classifier.out_proj")
    elif task in ("token_classification", "multiple_choice"):
        m += lin("classifier", "classifier")
    elif task == "question_answering":
        m += lin("qa_outputs", "qa_outputs")
    elif task == "masked_lm":
        m += lin("lm_head.dense", "lm_head.dense") + lin("lm_head.layer_norm", "lm_head.layer_norm")
        m.append(("lm_head.bias", ("lm_head.bias",), "copy"))
    return m


def tiny_config(task: str = "base", hidden: int = 64, heads: int = 4, layers: int = 2, vocab: int = 211, **kw):
    """A small transformers MPNetConfig for tests (Architecture.tiny_config): pad id 1 (positions start at 2), a
    160-row position table (158 tokens, past the bias's max distance 128), 32 buckets; question answering has 2
    labels."""
    import transformers

    kw.setdefault("num_labels", 2 if task == "question_answering" else 5)
    return transformers.MPNetConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                    num_attention_heads=heads, intermediate_size=2 * hidden + 8,
                                    max_position_embeddings=160, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                    attn_implementation="eager", **kw)


ARCHITECTURE = Architecture(
    model_type="mpnet",
    config=MPNetConfig,
    heads=heads_of(MPNetModel, MPNetForSequenceClassification, MPNetForTokenClassification,
                   MPNetForQuestionAnswering, MPNetForMaskedLM, MPNetForMultipleChoice),
    weight_map=weight_map,
    head_prefix="mpnet.",
    # transformers' MPNet forward takes token_type_ids through **kwargs and ignores it (a BERT-style tokenizer sends
    # it from sentence-transformers): accelerate ignores it too; the fastenc models take none
    inputs=frozenset({"input_ids", "attention_mask", "token_type_ids", "return_dict", "num_items_in_batch"}),
    token_types=False,
    config_overrides=roberta.pooler_override,
    lora_targets=("q", "v"),  # (PEFT has no default for mpnet: the query and value projections, as BERT's)
    pooling="mean",
    base_output="BaseModelOutputWithPooling",
    tiny_config=tiny_config,
)
