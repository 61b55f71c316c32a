"""ModernBERT encoder (Warner et al. 2024) on packed tokens: bias-free LayerNorm (not RMSNorm), RoPE with theta
per layer type (global 160000, local 10000), global attention every third layer and a sliding window of
local_attention tokens (|i - j| <= local_attention // 2) on the others, GeGLU MLP with exact GELU, no attention
norm on layer 0, final norm. Pre-norm residual adds are fused into the following LayerNorm.

Usage: model(input_ids, attention_mask=None) -> last hidden state (batch, seq, hidden), zeros at padded positions;
return_packed=True -> (hidden (total_tokens, hidden), PackedBatch). Heads: ModernBertForSequenceClassification
(cls/mean pooling -> head -> classifier), ModernBertForTokenClassification, ModernBertForQuestionAnswering,
ModernBertForMaskedLM (decoder tied to embeddings.tok, logits only where asked for), ModernBertForMultipleChoice
(the sequence classifier's pooling and head per choice, one score each: fastenc.models.multiple_choice). Parameter names follow Hugging
Face's (embeddings.tok.weight, embeddings.norm, layers.i.{attn_norm,attn.Wqkv,attn.Wo,mlp_norm,mlp.Wi,mlp.Wo},
final_norm, head.{dense,norm}, classifier, decoder_bias).
Training: parameters require grad; model.train() turns on transformers' dropouts (embedding_dropout after the
embedding norm, attention_dropout on the attention probabilities and on Wo's output, mlp_dropout before the MLP's
Wo, classifier_dropout after the head); heads take labels= and return transformers' output with the loss.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastenc import ops
from fastenc.layers import GeGLUMLP, LayerNorm, Linear, SelfAttention, activation
from fastenc.layers.embedding import embedding, padding_row
from fastenc.lora import LoraMixin
from fastenc.quant.model import QuantMixin
from fastenc.models import losses
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.convert import Entry, lin
from fastenc.models.multiple_choice import MultipleChoice
from fastenc.models.saving import SaveMixin
from fastenc.models.base import TextEncoderMixin, check_text_inputs, pack_text
from fastenc.models.columns import (column_attention, padded_first_rows, padded_positions, row_tokens,
                                    rows_with_holes)
from fastenc.models.config import ModernBertConfig
from fastenc.padding import gather_rows
from fastenc.ops.direct import Plan


class ModernBertEmbeddings(nn.Module):
    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.norm = LayerNorm(cfg.hidden_size, cfg.norm_eps, bias=cfg.norm_bias)
        self.dropout = cfg.embedding_dropout
        self.pad = padding_row(cfg.pad_token_id, cfg.vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.norm(embedding(ids, self.tok.weight, padding_idx=self.pad))
        return F.dropout(x, self.dropout, training=True) if self.training and self.dropout > 0 else x


class ModernBertLayer(nn.Module):
    def __init__(self, cfg: ModernBertConfig, index: int):
        super().__init__()
        h = cfg.hidden_size
        self.kind = cfg.layer_types[index]
        half = cfg.local_attention // 2
        window = (half, half) if self.kind == "sliding_attention" else None
        self.attn_norm = None if index == 0 else LayerNorm(h, cfg.norm_eps, bias=cfg.norm_bias)
        self.attn = SelfAttention(h, cfg.num_attention_heads, bias=cfg.attention_bias, window=window,
                                  dropout=cfg.attention_dropout)
        self.mlp_norm = LayerNorm(h, cfg.norm_eps, bias=cfg.norm_bias)
        self.mlp = GeGLUMLP(h, cfg.intermediate_size, cfg.hidden_activation, bias=cfg.mlp_bias,
                            dropout=cfg.mlp_dropout)

    def out_dropout(self) -> float:
        """The dropout on Wo's output (transformers' out_drop: attention_dropout), 0 in eval mode."""
        return self.attn.dropout if self.training else 0.0

    def forward(self, h: torch.Tensor, delta, step: "_Step", trim: bool = False, queries=None):
        """One pre-norm block: h += drop(Wo(attention(rope(q, k), v))) of attn_norm(h) (layer 0: no norm there);
        h += Wo(drop(geglu(Wi(mlp_norm(h))))). h: the residual stream (tokens, hidden); delta: (y, bias), the
        previous block's output not yet added to h (the add fused into this block's attn_norm), or None.
        Returns (h, delta, queries): this block's output left in delta for the next norm, or, through the
        forward's plan (step.plan, eval mode on CPU), added into h in place (delta None).
        trim: the second half at each sequence's first row only (h and the result (batch, hidden); keys and values
        at every token). queries: the padded queries' stream (h, delta) beside the packed tokens (their attention
        over the real tokens by columns.column_attention), or None."""
        plan = step.plan
        rope = (*step.tables[self.kind], step.pos)
        if plan is not None and delta is None and not trim and queries is None:
            y = h if self.attn_norm is None else self.attn_norm(h, plan=plan)
            _accumulate(self.attn.Wo, self.attn.attend(y, step.cu_seqlens, step.max_seqlen, rope, plan), h)
            _accumulate(self.mlp.Wo, self.mlp.gated(self.mlp_norm(h, plan=plan), plan), h)
            return h, None, None
        y, h = self._pre(h, delta)
        window = self.attn.window
        holes_here = step.hole_tok is not None and window is not None
        if trim and not holes_here:  # queries at the first rows only (keys and values at every token)
            o = self.attn.attend_rows(y, step.cu_seqlens, step.max_seqlen, step.batch.first_rows(), rope=rope)
            h = _first_rows(h, step.batch)
        else:
            o = self.attn.attend(y, step.cu_seqlens, step.max_seqlen, rope=rope)
            if holes_here:  # sliding windows in padded columns, as transformers measures them
                fixed = column_attention(self.attn, y[step.hole_tok], step.hole_rows, step.pos[step.hole_tok], y,
                                         step.cu_seqlens, step.pos, window, rope[:2])
                o = o.index_copy(0, step.hole_tok, fixed)
            if trim:
                o, h = _first_rows(o, step.batch), _first_rows(h, step.batch)
        if queries is not None:
            yg, hg = self._pre(*queries)
            og = column_attention(self.attn, yg, step.rows, step.cols, y, step.cu_seqlens, step.pos, window,
                                  rope[:2], seq=step.seq)
            queries = self._post(og, hg)
        return (*self._post(o, h), queries)

    def _pre(self, h: torch.Tensor, delta) -> tuple[torch.Tensor, torch.Tensor]:
        """(attn_norm(h + delta), h + delta): the attention input and the residual stream."""
        if delta is None:
            return (h if self.attn_norm is None else self.attn_norm(h)), h
        return self.attn_norm(delta[0], residual=h, input_bias=delta[1])

    def _post(self, o: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """The block after attention: (h + drop(Wo o), the MLP's output on its norm, not yet added)."""
        a, a_bias = self.attn.Wo(o, with_bias=False), self.attn.Wo.output_bias()
        p = self.out_dropout()
        if p > 0:  # transformers' out_drop(Wo(o)): the bias added before the dropout
            a = F.dropout(a if a_bias is None else a + a_bias, p, training=True)
            a_bias = None
        y, h = self.mlp_norm(a, residual=h, input_bias=a_bias)
        return h, (self.mlp(y, out_bias=False), self.mlp.Wo.output_bias())


def _accumulate(linear: Linear, x: torch.Tensor, out: torch.Tensor) -> None:
    """out += linear(x), bias included, in place."""
    linear.accumulate_(x, out)
    if linear.bias is not None:
        out.add_(linear.bias)


class _Step:
    """What every block of one forward shares: the packed batch, the RoPE tables and positions, the tokens of rows
    whose mask has holes (hole_tok, their rows), the padded queries' (rows, cols) and row length (seq: the padded
    width where every padded column is computed, else None), and the plan (fastenc.ops.direct.Plan or None)."""

    __slots__ = ("batch", "cu_seqlens", "max_seqlen", "pos", "tables", "hole_tok", "hole_rows", "rows", "cols",
                 "seq", "plan")

    def __init__(self, **kw):
        for name in self.__slots__:
            setattr(self, name, kw.get(name))


def _plan(layers, h: torch.Tensor, cu_seqlens: torch.Tensor, tables: dict, pos: torch.Tensor) -> Plan | None:
    """This forward's direct cpu-kernel form of the blocks (fastenc.ops.direct.Plan), or None: only for
    ModernBERT's own blocks in eval mode with plain Linears (not carrying unmerged LoRA), no autograd recording."""
    if not layers or torch.is_grad_enabled():
        return None
    for layer in layers:  # (submodules read from _modules: nn.Module.__getattr__ costs ~1 us a lookup, per forward)
        if not isinstance(layer, ModernBertLayer) or layer.training:
            return None
        mods = layer._modules
        mlp, attn, attn_norm = mods["mlp"], mods["attn"]._modules, mods.get("attn_norm")  # (layer 0: no attn_norm)
        if (type(mlp) is not GeGLUMLP or type(mods["mlp_norm"]) is not LayerNorm
                or (attn_norm is not None and type(attn_norm) is not LayerNorm)
                or any(type(m) is not Linear
                       for m in (attn["Wqkv"], attn["Wo"], mlp._modules["Wi"], mlp._modules["Wo"]))):
            return None
    return Plan.make(h, cu_seqlens, layers[0].attn.heads, layers[0].mlp_norm, (*tables[layers[0].kind], pos))


class ModernBertHead(nn.Module):
    """norm(act(dense(x))): ModernBERT's prediction head before the classifier."""

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.act = cfg.classifier_activation
        self.dense = Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.classifier_bias)
        self.norm = LayerNorm(cfg.hidden_size, cfg.norm_eps, bias=cfg.norm_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(activation(self.act, self.dense(x, with_bias=False), self.dense.output_bias()))


class ModernBertModel(QuantMixin, LoraMixin, SaveMixin, TextEncoderMixin, nn.Module):
    task = "base"

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.config = config
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = LayerNorm(config.hidden_size, config.norm_eps, bias=config.norm_bias)
        self._rope: dict = {}

    def _rope_table(self, kind: str, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos/sin (positions, head_dim/2) for this layer type, grown on demand (kept out of state_dict)."""
        theta = self.config.rope_theta_global if kind == "full_attention" else self.config.rope_theta_local
        key = (kind, str(device))
        have = self._rope.get(key)
        if have is None or have[0].shape[0] < length:
            n = max(length, 512)
            with torch.inference_mode(False):  # (normal tensors: a training forward may save them)
                self._rope[key] = ops.rope_cache(self.config.head_dim, n, theta, device=device)
        return self._rope[key]

    def _encode(self, input_ids, attention_mask=None, token_type_ids=None):
        """Embeddings + all layers on packed tokens. Returns (x (total, hidden), PackedBatch)."""
        x, batch, _ = self._run(input_ids, attention_mask)
        return x, batch

    def _run(self, input_ids, attention_mask=None, column0: bool = False, padded: bool = False,
             first_only: bool = False):
        """(x (total, hidden), PackedBatch, first): first (batch, hidden) is the last hidden state at column 0 of
        each row when column0=True (None otherwise): the first real token's, or, where column 0 is padding, a
        padded query's as transformers computes it (it sees the row's real tokens and is no key itself).
        padded=True: first is instead (rows, cols, states (n, hidden)) of every padded position, computed the same
        way (None without padding; a padded query that sees no real token in a local window averages v over the
        whole row, padded columns included, as transformers' eager attention does). With column0 only, a padded
        column 0 that sees no real token in a local window (64+ columns of left padding) gets zeros there: the
        other padded columns it would average over are not computed.

        Sliding windows are measured in padded columns, as transformers does: rows whose mask has holes (real
        tokens not contiguous) get their local layers' attention recomputed by columns.column_attention.

        first_only=True (without column0 / padded): x is (batch, hidden), each sequence's first real token only
        (zeros for an empty one): the last layer projects keys and values at every token but runs its queries
        (SelfAttention.attend_rows; not for a sliding window over a mask with holes), Wo, its norms and its MLP, and
        the final norm, on those rows alone (cls pooling reads nothing else)."""
        cfg = self.config
        input_ids, mask, _ = check_text_inputs(type(self).__name__, input_ids, attention_mask, None,
                                               cfg.vocab_size, cfg.max_position_embeddings)
        batch, ids, pos = pack_text(input_ids, mask)
        pos = pos.to(torch.int32)
        length = int(input_ids.shape[1])
        tables = {k: self._rope_table(k, length, ids.device) for k in set(cfg.layer_types)}
        holes = rows_with_holes(mask) if any(layer.attn.window is not None for layer in self.layers) else None
        step = _Step(batch=batch, cu_seqlens=batch.cu_seqlens, max_seqlen=batch.max_seqlen, pos=pos, tables=tables,
                     seq=length if padded else None)
        if holes is not None:
            step.hole_tok = row_tokens(batch.cu_seqlens, holes)
            step.hole_rows = torch.repeat_interleave(holes, batch.seqlens()[holes])
        rows, cols = padded_positions(mask) if padded else (padded_first_rows(mask) if column0 else None, None)
        queries = None
        if rows is not None:  # the padded queries' residual stream (column 0 or all), run beside the packed tokens
            cols = torch.zeros_like(rows) if cols is None else cols
            step.rows, step.cols = rows, cols
            queries = (self.embeddings(input_ids[rows, cols]), None)
        h = self.embeddings(ids)  # the residual stream
        if step.hole_tok is None and rows is None:  # inference on CPU: the blocks' kernels through one plan
            step.plan = _plan(self.layers, h, batch.cu_seqlens, tables, pos)
        first_only = first_only and not (column0 or padded)
        last = len(self.layers) - 1
        delta = None  # the last block's output not yet added to h
        for i, layer in enumerate(self.layers):
            h, delta, queries = layer(h, delta, step, trim=first_only and i == last, queries=queries)
        if delta is None:
            x = self.final_norm(_first_rows(h, batch) if first_only else h)
        else:
            x = self._final(h, delta)
        if first_only:
            empty = batch.seqlens() == 0
            return (x.masked_fill(empty[:, None], 0) if bool(empty.any()) else x), batch, None
        states = None if rows is None else self._final(*queries)
        if padded:
            return x, batch, None if rows is None else (rows, cols, states)
        first = None
        if column0:
            first = batch.first_tokens(x)
            if rows is not None:
                first = first.index_copy(0, rows, states.to(first.dtype))
        return x, batch, first

    def _final(self, h: torch.Tensor, delta) -> torch.Tensor:
        """final_norm(h + delta), delta being the last block's output not yet added (None: already in h)."""
        if delta is None:
            return self.final_norm(h)
        return self.final_norm(delta[0], residual=h, input_bias=delta[1], return_residual=False)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, *, return_packed: bool = False):
        x, batch = self._encode(input_ids, attention_mask)
        return (x, batch) if return_packed else batch.pad(x)

    def _apply(self, fn, *args, **kwargs):
        self._rope = {}
        return super()._apply(fn, *args, **kwargs)


class _ModernBertWithHead(ModernBertModel):
    """ModernBertModel + prediction head (dense, act, norm) + classifier Linear(hidden, num_labels)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.head = ModernBertHead(config)
        self.classifier = Linear(config.hidden_size, config.num_labels)

    def classify(self, x: torch.Tensor) -> torch.Tensor:
        """classifier(drop(head(x))), classifier_dropout in training mode."""
        y = self.head(x)
        p = self.config.classifier_dropout if self.training else 0.0
        return self.classifier(F.dropout(y, p, training=True) if p > 0 else y)


class ModernBertForSequenceClassification(_ModernBertWithHead):
    """logits = classifier(head(pool(hidden))), pool = first token ('cls') or masked mean ('mean').
    labels= -> transformers' SequenceClassifierOutput(loss, logits) (see fastenc.models.losses)."""
    task = "sequence_classification"

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        name = type(self).__name__
        kind = None if labels is None else losses.check_sequence_labels(name, self.config, labels, losses.grid(input_ids)[0])
        if self.config.classifier_pooling == "mean":
            x, batch = self._encode(input_ids, attention_mask)
            pooled = batch.mean(x)
        else:
            pooled, _, _ = self._run(input_ids, attention_mask, first_only=True)
        logits = self.classify(pooled)
        if labels is None:
            return logits
        return losses.output(self.task, losses.sequence_loss(self.config, kind, logits, labels), logits)


class ModernBertForMultipleChoice(MultipleChoice, ModernBertModel):
    """input_ids (batch, choices, seq) (attention_mask alike) -> logits (batch, choices): classifier(drop(head(
    pool))) per choice, pool as the sequence classifier's (classifier_pooling 'cls': the first real token, as
    transformers' argmax of the mask; 'mean': the mean over the real tokens), dropout classifier_dropout.
    labels= int (batch,) -> MultipleChoiceModelOutput(loss, logits)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.head = ModernBertHead(config)

    def choice_pool(self, ids, mask, types) -> torch.Tensor:
        if self.config.classifier_pooling == "mean":
            x, batch = self._encode(ids, mask)
            return self.head(batch.mean(x))
        return self.head(self._run(ids, mask, first_only=True)[0])

    @property
    def choice_dropout(self) -> float:
        return self.config.classifier_dropout


class ModernBertForTokenClassification(_ModernBertWithHead):
    """logits = classifier(head(hidden)): (batch, seq, num_labels), zeros at padded positions.
    labels= int (batch, seq), -100 ignored (and required at padded positions) -> TokenClassifierOutput(loss, logits), loss over the packed
    tokens."""
    task = "token_classification"

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        if labels is not None:
            losses.check_token_labels(type(self).__name__, self.config, labels, losses.grid(input_ids),
                                    attention_mask)
        x, batch = self._encode(input_ids, attention_mask)
        packed = self.classify(x)
        logits = batch.pad(packed)
        if labels is None:
            return logits
        loss = losses.cross_entropy(packed, batch.gather(labels.to(packed.device).reshape(batch.batch, batch.seq)))
        return losses.output(self.task, loss, logits)



class ModernBertForQuestionAnswering(_ModernBertWithHead):
    """classifier(drop(head(hidden))) -> (start_logits, end_logits), each (batch, seq), zeros at padding.
    start_positions= / end_positions= int (batch,) -> QuestionAnsweringModelOutput(loss, start, end): transformers'
    loss (softmax over every column, the padded ones' logits computed as transformers does; positions outside
    [0, seq) ignored; num_items_in_batch: sums divided by it, as transformers' loss function does)."""
    task = "question_answering"

    def __init__(self, config: ModernBertConfig):
        losses.check_qa_labels_count(type(self).__name__, config)
        super().__init__(config)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None,
                end_positions=None, num_items_in_batch=None):
        return losses.answer_spans(self, input_ids, start_positions, end_positions,
                                  lambda padded: self._run(input_ids, attention_mask, padded=padded), self.classify,
                                  num_items_in_batch)


class ModernBertForMaskedLM(ModernBertModel):
    """Masked-LM logits = head(hidden) @ embeddings.tok^T + decoder_bias (the decoder tied to the token embedding),
    by the convention of fastenc.models.losses.masked_lm: (batch, seq, vocab) with zeros at padding; positions= ->
    (n, vocab) there only; labels= -> MaskedLMOutput(loss, logits (n_labelled, vocab)) computed at the labelled
    tokens only. hf_forward gives transformers' shapes (config.sparse_prediction) for accelerate."""
    task = "masked_lm"

    def __init__(self, config: ModernBertConfig):
        losses.check_tied(type(self).__name__, config)
        super().__init__(config)
        self.head = ModernBertHead(config)
        self.decoder_bias = nn.Parameter(torch.zeros(config.vocab_size)) if config.decoder_bias else None

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """(n, hidden) packed hidden states -> (n, vocab) logits."""
        return losses.decode(self.head, self.head(x), self.embeddings.tok.weight, self.decoder_bias)

    def mlm_projection(self, x: torch.Tensor):
        """(transformed (n, hidden), decoder weight (vocab, hidden), decoder bias (vocab,) or None): predict(x)
        is transformed @ weight^T + bias (encode(output='sparse') fuses that product with its max)."""
        return self.head(x), self.embeddings.tok.weight, self.decoder_bias

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, *, positions=None,
                num_items_in_batch=None):
        name = type(self).__name__
        if labels is not None:
            losses.check_mlm_labels(name, self.config.vocab_size, labels, losses.grid(input_ids))
        x, batch = self._encode(input_ids, attention_mask)
        return losses.masked_lm(name, self.predict, x, batch, labels, positions, num_items_in_batch)

    def hf_forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, num_items_in_batch=None):
        """transformers' ModernBertForMaskedLM fields: with labels and config.sparse_prediction, logits at the
        labelled tokens only (n_labelled, vocab); otherwise (batch, seq, vocab) at every real token."""
        name = type(self).__name__
        if labels is not None:
            losses.check_mlm_labels(name, self.config.vocab_size, labels, losses.grid(input_ids))
        x, batch = self._encode(input_ids, attention_mask)
        out = losses.masked_lm(name, self.predict, x, batch, labels, None, num_items_in_batch,
                              dense=not self.config.sparse_prediction)
        return {"logits": out} if labels is None else {"loss": out.loss, "logits": out.logits}


def _first_rows(x: torch.Tensor, batch) -> torch.Tensor:
    """(total, hidden) packed rows -> (batch, hidden) at each sequence's first token (an empty sequence takes some
    valid row; the caller zeroes its output)."""
    if batch.total == 0:
        return x.new_zeros(batch.batch, *x.shape[1:])
    rows = batch.first_rows()
    return gather_rows(x, rows)


def weight_map(cfg: ModernBertConfig, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every ModernBERT tensor (prefix: "model." inside the head classes)."""
    p, nb = prefix, cfg.norm_bias
    m: list[Entry] = [("embeddings.tok.weight", (f"{p}embeddings.tok_embeddings.weight",), "copy"),
                      *lin("embeddings.norm", f"{p}embeddings.norm", nb)]
    for i in range(cfg.num_hidden_layers):
        f, h = f"layers.{i}", f"{p}layers.{i}"
        if i > 0:
            m += lin(f"{f}.attn_norm", f"{h}.attn_norm", nb)
        m += lin(f"{f}.attn.Wqkv", f"{h}.attn.Wqkv", cfg.attention_bias)
        m += lin(f"{f}.attn.Wo", f"{h}.attn.Wo", cfg.attention_bias)
        m += lin(f"{f}.mlp_norm", f"{h}.mlp_norm", nb)
        m += lin(f"{f}.mlp.Wi", f"{h}.mlp.Wi", cfg.mlp_bias)
        m += lin(f"{f}.mlp.Wo", f"{h}.mlp.Wo", cfg.mlp_bias)
    m += lin("final_norm", f"{p}final_norm", nb)
    if task != "base":
        m += lin("head.dense", "head.dense", cfg.classifier_bias)
        m += lin("head.norm", "head.norm", nb)
    if task in ("sequence_classification", "token_classification", "question_answering", "multiple_choice"):
        m += lin("classifier", "classifier")
    if task == "masked_lm" and cfg.decoder_bias:  # the decoder weight is embeddings.tok's (tied, stored once)
        m.append(("decoder_bias", ("decoder.bias",), "copy"))
    return m


def hf_config(cfg: ModernBertConfig) -> dict:
    """config.json entries transformers reads the RoPE thetas from."""
    return {"rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta_global},
        "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta_local}}}


def tiny_config(task: str = "base", hidden: int = 64, heads: int = 4, layers: int = 4, pooling: str = "cls", **kw):
    """A small transformers ModernBertConfig for tests (Architecture.tiny_config): 4 layers, so both layer types
    (global every third) and layer 0's missing attention norm are exercised."""
    import transformers

    return transformers.ModernBertConfig(vocab_size=211, hidden_size=hidden, num_hidden_layers=layers,
                                         num_attention_heads=heads, intermediate_size=hidden + 24,
                                         max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
                                         eos_token_id=2, cls_token_id=1, sep_token_id=2,
                                         num_labels=2 if task == "question_answering" else 3,
                                         classifier_pooling=pooling, attn_implementation="eager", **kw)


ARCHITECTURE = Architecture(
    model_type="modernbert",
    config=ModernBertConfig,
    heads=heads_of(ModernBertModel, ModernBertForSequenceClassification, ModernBertForTokenClassification,
                   ModernBertForQuestionAnswering, ModernBertForMaskedLM, ModernBertForMultipleChoice),
    weight_map=weight_map,
    head_prefix="model.",
    token_types=False,  # (transformers' forward takes token_type_ids and ignores them; so does accelerate)
    hf_config=hf_config,
    lora_targets=("Wqkv",),
    tiny_config=tiny_config,
)
