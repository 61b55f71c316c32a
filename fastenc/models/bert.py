"""BERT encoder (Devlin et al. 2018) on packed tokens: word + position + token-type embeddings, post-LayerNorm
blocks with one fused QKV GEMM, GELU MLP with fused bias, varlen attention; tanh pooler; classification heads.

Usage: model = BertModel(BertConfig(...)) or fastenc.from_hf(hf_bert) / fastenc.from_pretrained(folder);
  model(input_ids, attention_mask=None, token_type_ids=None) -> last hidden state (batch, seq, hidden), zeros at
  padded positions; return_packed=True -> (hidden (total_tokens, hidden), PackedBatch with cu_seqlens).
  model.pool(last_hidden, attention_mask) -> pooler output (batch, hidden); model.encode(texts) -> sentence
  embeddings. Pooling (pooler, classifier, encode(pooling='cls')) reads each row's first real token, left
  padding or not; fastenc.accelerate follows transformers instead (column 0, padding or not).
Training: parameters require grad; model.train() turns on transformers' dropouts (embeddings, attention
  probabilities, attention and MLP outputs: hidden_dropout_prob / attention_probs_dropout_prob; the classifier's
  classifier_dropout); heads take labels= and return transformers' output with the loss (fastenc.models.losses).
  Without autograd recording (torch.no_grad / inference_mode) and without dropout, the residual adds run in
  place inside the GEMMs; otherwise every step makes new tensors. Sequence classification with labels or under
  autograd runs the last layer's queries, Wo, norms and MLP on each sequence's first token only (run_first_rows;
  keys and values at every token): the classifier reads nothing else.
Parameter names (fastenc side of the weight map, `weight_map` below): embeddings.{word,position,token_type}.weight,
embeddings.norm.*, layers.i.attn.Wqkv.*, layers.i.attn.Wo.*, layers.i.attn_norm.*, layers.i.mlp.fc1.*,
layers.i.mlp.fc2.*, layers.i.mlp_norm.*, pooler.*, classifier.*, qa_outputs.*, mlm.{dense,norm}.*, mlm.bias (the
masked-LM decoder weight is embeddings.word.weight itself).
Heads: sequence / token classification, question answering (start, end logits), masked LM (logits only where asked
for: fastenc.models.losses.masked_lm), multiple choice (fastenc.models.multiple_choice).
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F
from torch import nn

from fastenc.layers import MLP, LayerNorm, Linear, SelfAttention, activation
from fastenc.layers.dropout import dropout
from fastenc.layers.embedding import embedding, padding_row
from fastenc.lora import LoraMixin
from fastenc.quant.model import QuantMixin
from fastenc.models import losses
from fastenc.models.multiple_choice import MultipleChoice
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.convert import Entry, lin, qkv
from fastenc.models.saving import SaveMixin
from fastenc.models.base import TextEncoderMixin, check_text_inputs, first_real, pack_text
from fastenc.models.columns import column_attention, padded_first_rows, padded_positions
from fastenc.models.config import BertConfig
from fastenc.padding import gather_rows
from fastenc.ops.direct import Plan
from fastenc.models.bert_direct import _GELU, direct_block, direct_linears



class BertEmbeddings(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.dropout = cfg.hidden_dropout_prob
        self.pad = padding_row(cfg.pad_token_id, cfg.vocab_size)
        # the position table's row that gets no gradient (RoBERTa's padding_idx: padded columns' position, read by
        # a padded column-0 query), None for BERT's
        self.pos_pad = getattr(cfg, "position_padding_idx", None)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, types: torch.Tensor | None) -> torch.Tensor:
        """ids, positions, types: packed (tokens,) -> (tokens, hidden)."""
        x = embedding(ids, self.word.weight, padding_idx=self.pad)
        if types is None:
            x = x + self.token_type.weight[0]
        else:
            x = x + F.embedding(types, self.token_type.weight)
        x = self.norm(F.embedding(positions, self.position.weight, padding_idx=self.pos_pad), residual=x,
                      return_residual=False)
        return dropout(x, self.dropout) if self.training and self.dropout > 0 else x

    def planned(self, ids: torch.Tensor, positions: torch.Tensor, types: torch.Tensor | None, layers,
                cu_seqlens: torch.Tensor) -> tuple[torch.Tensor, Plan | None]:
        """forward() in inference, with the Plan of the blocks that follow (fastenc.ops.direct) made on the
        embeddings' sum and running their LayerNorm -> (x, plan); plan None (x as forward()'s) when none applies."""
        if self.training or torch.is_grad_enabled() or type(self.norm) is not LayerNorm:
            return self(ids, positions, types), None
        x = F.embedding(ids, self.word.weight, padding_idx=self.pad)
        x.add_(self.token_type.weight[0] if types is None else F.embedding(types, self.token_type.weight))
        plan = _plan(layers, x, cu_seqlens)
        at = F.embedding(positions, self.position.weight)
        return self.norm(at, residual=x, return_residual=False, plan=plan), plan


class BertLayer(nn.Module):
    """Post-norm block: x = LN(x + drop(attn(x))); x = LN(x + drop(mlp(x))). Inference (no autograd recording, no
    dropout): the residual add happens inside the Wo and fc2 GEMMs (x += o Wo^T, accumulated into x once the QKV
    projection has read it), and the bias of each of those linears inside the LayerNorm that follows; the norms
    write only their output. Training: the add and the bias go into the LayerNorm (residual=, input_bias=),
    nothing is overwritten. gradient_checkpointing=True (fastenc.accelerate sets it from transformers' flag of the
    same name): in training under autograd the block's activations are not kept, the block is run again in the
    backward (checkpoint_func, default torch.utils.checkpoint.checkpoint(use_reentrant=False)), as transformers'
    GradientCheckpointingLayer does."""

    gradient_checkpointing = False
    checkpoint_func = None

    def __call__(self, *args, **kwargs):
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            run = self.checkpoint_func or (lambda fn, *a: checkpoint(fn, *a, use_reentrant=False))
            return run(functools.partial(super().__call__, **kwargs), *args)
        return super().__call__(*args, **kwargs)

    def __init__(self, cfg: BertConfig):
        super().__init__()
        h = cfg.hidden_size
        self.dropout = cfg.hidden_dropout_prob
        self.attn = SelfAttention(h, cfg.num_attention_heads, bias=True, dropout=cfg.attention_probs_dropout_prob)
        self.attn_norm = LayerNorm(h, cfg.layer_norm_eps)
        self.mlp = MLP(h, cfg.intermediate_size, cfg.hidden_act)
        self.mlp_norm = LayerNorm(h, cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                rows: torch.Tensor | None = None, plan: Plan | None = None) -> torch.Tensor:
        """x: (tokens, hidden), a buffer of this model's own (the embeddings' or the previous layer's output): it
        is overwritten unless autograd records the call or dropout is on. rows (n,) int64: attention over every
        token, then Wo, the norms and the MLP at those rows only -> (n, hidden). plan: the forward's
        fastenc.ops.direct.Plan (its cpu kernels called directly) or None (the public ops)."""
        if rows is None:
            lins = None if plan is None or plan.record else direct_linears(self, x)
            if lins is not None:
                return direct_block(self, x, plan, lins)
            return self.finish(self.attn.attend(x, cu_seqlens, max_seqlen, plan=plan), x, plan)
        return self.finish(self.attn.attend_rows(x, cu_seqlens, max_seqlen, rows), gather_rows(x, rows))

    def dropouts(self) -> tuple[float, float]:
        """The dropout on the attention output and on the MLP output (0 in eval mode)."""
        p = self.dropout if self.training else 0.0
        return p, p

    def finish(self, o: torch.Tensor, x: torch.Tensor, plan: Plan | None = None) -> torch.Tensor:
        """The block after attention: LN(x + drop(Wo o)), then LN(. + drop(mlp(.))). o: the attention output at
        x's rows (before Wo); x: the residual, overwritten where the block runs in place (see forward)."""
        pa, pm = self.dropouts()
        if not torch.is_grad_enabled() and pa == pm == 0:
            self.attn.Wo.accumulate_(o, x)
            x = self.attn_norm(x, input_bias=self.attn.Wo.output_bias(), plan=plan)
            self.mlp.fc2.accumulate_(self.mlp.hidden(x, plan), x)
            return self.mlp_norm(x, input_bias=self.mlp.fc2.output_bias(), plan=plan)
        x = _add_norm(self.attn_norm, self.attn.Wo, o, x, pa)
        return _add_norm(self.mlp_norm, self.mlp.fc2, self.mlp.hidden(x), x, pm)


def run_first_rows(layers, x: torch.Tensor, batch, pos: torch.Tensor, plan: Plan | None = None):
    """run_blocks for a head that reads each sequence's first token only (sequence classification): the last block
    projects keys and values at every token but its queries, Wo, its norms and its MLP at the first rows
    (cu_seqlens[:-1]) alone (SelfAttention.attend_rows).
    Returns (first (batch, hidden), batch, None), zeros for an empty sequence as PackedBatch.first_tokens gives."""
    if not len(layers) or batch.total == 0:
        x, batch, _ = run_blocks(layers, x, batch, pos, None, False, False, plan)
        return batch.first_tokens(x), batch, None
    x, batch, _ = run_blocks(layers[:-1], x, batch, pos, None, False, False, plan)
    start = batch.first_rows()
    first = layers[-1](x, batch.cu_seqlens, batch.max_seqlen, rows=start)
    empty = batch.seqlens() == 0
    return (first.masked_fill(empty[:, None], 0) if bool(empty.any()) else first), batch, None


def run_blocks(layers, x: torch.Tensor, batch, pos: torch.Tensor, queries, column0: bool, padded: bool,
               plan: Plan | None = None):
    """Post-norm blocks over the packed tokens x, with padded queries (rows, cols, states) run beside them (each
    block reads x before overwriting it). Returns what `_run` returns: (x, batch, first), first being column 0's
    state per row (column0), the padded queries (rows, cols, states) (padded), or None. plan: the forward's Plan
    when the embeddings made it (BertEmbeddings.planned), else one is made here when it applies."""
    rows, cols, xg = queries if queries is not None else (None, None, None)
    plan = _plan(layers, x, batch.cu_seqlens) if plan is None else plan
    for layer in layers:
        if rows is not None:  # (before `layer` overwrites x)
            xg = layer.finish(column_attention(layer.attn, xg, rows, cols, x, batch.cu_seqlens, pos), xg)
        x = layer(x, batch.cu_seqlens, batch.max_seqlen, plan=plan)
    if padded:
        return x, batch, None if rows is None else (rows, cols, xg)
    first = None
    if column0:
        first = batch.first_tokens(x)
        if rows is not None:
            first = first.index_copy(0, rows, xg.to(first.dtype))
    return x, batch, first


def _plan(layers, x: torch.Tensor, cu_seqlens: torch.Tensor) -> Plan | None:
    """This forward's direct cpu-kernel form of the blocks (fastenc.ops.direct.Plan), or None: only for BERT's
    blocks (DistilBERT's too) in eval mode with plain Linears (not carrying unmerged LoRA) and a GELU
    activation."""
    if not layers or torch.is_grad_enabled():
        return None
    for layer in layers:  # (submodules read from _modules: nn.Module.__getattr__ costs ~1 us a lookup, per forward)
        if not isinstance(layer, BertLayer) or layer.training:
            return None
        mods = layer._modules
        mlp, attn = mods["mlp"], mods["attn"]._modules
        if (type(mlp) is not MLP or _GELU.get(mlp.act) is None or type(mods["attn_norm"]) is not LayerNorm
                or type(mods["mlp_norm"]) is not LayerNorm
                or any(type(m) is not Linear
                       for m in (attn["Wqkv"], attn["Wo"], mlp._modules["fc1"], mlp._modules["fc2"]))):
            return None
    return Plan.make(x, cu_seqlens, layers[0].attn.heads, layers[0].attn_norm)


def _add_norm(norm: LayerNorm, linear: Linear, y: torch.Tensor, residual: torch.Tensor, p: float) -> torch.Tensor:
    """norm(dropout(linear(y)) + residual): the linear's bias fused into the dropout, or into the norm when there is
    no dropout."""
    if p > 0:
        return norm(dropout(linear(y, with_bias=False), p, linear.output_bias()), residual=residual,
                    return_residual=False)
    return norm(linear(y, with_bias=False), residual=residual, input_bias=linear.output_bias(),
                return_residual=False)


class BertModel(QuantMixin, LoraMixin, SaveMixin, TextEncoderMixin, nn.Module):
    task = "base"

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.pooler = Linear(config.hidden_size, config.hidden_size) if config.add_pooling_layer else None

    def _encode(self, input_ids, attention_mask=None, token_type_ids=None):
        """Embeddings + all layers on packed tokens. Returns (x (total, hidden), PackedBatch)."""
        x, batch, _ = self._run(input_ids, attention_mask, token_type_ids)
        return x, batch

    def _run(self, input_ids, attention_mask=None, token_type_ids=None, column0: bool = False, padded: bool = False,
             first_only: bool = False):
        """(x (total, hidden), PackedBatch, first): first (batch, hidden) is the last hidden state at column 0 of
        each row when column0=True (None otherwise): the first real token's, or, where column 0 is padding, a
        padded query's as transformers computes it (it sees the row's real tokens and is no key itself).
        padded=True: first is instead (rows, cols, states (n, hidden)) of every padded position, computed the same
        way (None without padding). first_only=True (without column0 / padded): x is (batch, hidden), each
        sequence's first real token only, its last layer trimmed to those rows (run_first_rows)."""
        cfg = self.config
        input_ids, mask, types = check_text_inputs(type(self).__name__, input_ids, attention_mask, token_type_ids,
                                                   cfg.vocab_size, cfg.max_position_embeddings, cfg.type_vocab_size)
        batch, ids, pos = pack_text(input_ids, mask)
        if types is not None:
            types = types.to(input_ids.device)
        rows, cols = padded_positions(mask) if padded else (padded_first_rows(mask) if column0 else None, None)
        if rows is not None:
            cols = torch.zeros_like(rows) if cols is None else cols
        at, at_queries = self._positions(input_ids, batch, ids, pos, rows, cols)
        packed_types = None if types is None else batch.gather(types)
        layers = self.blocks()
        if type(self.embeddings) is BertEmbeddings:  # (its LayerNorm through the blocks' inference Plan)
            x, plan = self.embeddings.planned(ids, at, packed_types, layers, batch.cu_seqlens)
        else:
            x, plan = self.embeddings(ids, at, packed_types), None
        xg = None
        if rows is not None:  # the padded queries (column 0 or all), run beside the packed tokens
            xg = self.embeddings(input_ids[rows, cols], at_queries, None if types is None else types[rows, cols])
        if first_only and not (column0 or padded):
            return run_first_rows(layers, x, batch, pos, plan)
        return run_blocks(layers, x, batch, pos, (rows, cols, xg) if rows is not None else None, column0, padded,
                          plan)

    def blocks(self):
        """The blocks in the order the forward runs them: `layers` (ALBERT runs its shared ones several times)."""
        return self.layers

    def _positions(self, input_ids, batch, ids, pos, rows, cols):
        """Position ids (packed tokens (total,), padded queries (n,) or None) for the position embedding: BERT's
        are each token's column (pos, cols). An architecture with other positions (RoBERTa) overrides this; it gets
        the padded ids (batch, seq), the PackedBatch, the packed ids and columns and the padded queries' (rows,
        cols) (None when there is none)."""
        return pos, cols

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """tanh(dense(first token)): hidden (batch, seq, hidden) -> (batch, hidden). The first token is each
        row's first real token (attention_mask (batch, seq) given; the [CLS] token wherever padding puts it),
        else column 0."""
        if self.pooler is None:
            raise ValueError(f"{type(self).__name__}: this model has no pooler (add_pooling_layer=False)")
        return torch.tanh(self.pooler(first_real(hidden, attention_mask)))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, *, return_packed: bool = False):
        x, batch = self._encode(input_ids, attention_mask, token_type_ids)
        return (x, batch) if return_packed else batch.pad(x)


def _classifier_dropout(cfg: BertConfig) -> float:
    return cfg.hidden_dropout_prob if cfg.classifier_dropout is None else cfg.classifier_dropout


class BertForSequenceClassification(BertModel):
    """logits = classifier(drop(pooler(first real token))): (batch, num_labels).
    labels= (batch,) int / float (see fastenc.models.losses) -> transformers' SequenceClassifierOutput(loss, logits)."""
    task = "sequence_classification"

    def __init__(self, config: BertConfig):
        config = dataclasses.replace(config, add_pooling_layer=True)
        super().__init__(config)
        self.classifier = Linear(config.hidden_size, config.num_labels)

    def classify(self, first: torch.Tensor) -> torch.Tensor:
        """classifier(drop(tanh(pooler(first)))): first (batch, hidden), each row's first token."""
        pooled = torch.tanh(self.pooler(first))
        p = _classifier_dropout(self.config) if self.training else 0.0
        return self.classifier(F.dropout(pooled, p, training=True) if p > 0 else pooled)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        return losses.classify_sequence(self, input_ids, attention_mask, token_type_ids, labels)


class BertForTokenClassification(BertModel):
    """logits = classifier(drop(hidden)): (batch, seq, num_labels), zeros at padded positions.
    labels= int (batch, seq), -100 ignored -> transformers' TokenClassifierOutput(loss, logits); the loss is taken
    over the packed tokens; a label other than -100 at a padded position is refused (ValueError)."""
    task = "token_classification"

    def __init__(self, config: BertConfig):
        config = dataclasses.replace(config, add_pooling_layer=False)
        super().__init__(config)
        self.classifier = Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        if labels is not None:
            losses.check_token_labels(type(self).__name__, self.config, labels, losses.grid(input_ids),
                                    attention_mask)
        x, batch = self._encode(input_ids, attention_mask, token_type_ids)
        p = _classifier_dropout(self.config) if self.training else 0.0
        packed = self.classifier(F.dropout(x, p, training=True) if p > 0 else x)
        logits = batch.pad(packed)
        if labels is None:
            return logits
        loss = losses.cross_entropy(packed, batch.gather(labels.to(packed.device).reshape(batch.batch, batch.seq)))
        return losses.output(self.task, loss, logits)



class BertMLMHead(nn.Module):
    """transformers' cls.predictions: LayerNorm(act(dense(x))) @ decoder_weight^T + bias, the decoder weight being
    the word embedding (passed in: tied, one Parameter)."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.act = cfg.hidden_act
        self.dense = Linear(cfg.hidden_size, cfg.hidden_size)
        self.norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """x: (n, hidden) -> (n, hidden): LayerNorm(act(dense(x))), the states the decoder projects."""
        return self.norm(activation(self.act, self.dense(x, with_bias=False), self.dense.output_bias()))

    def forward(self, x: torch.Tensor, decoder_weight: torch.Tensor) -> torch.Tensor:
        """x: (n, hidden) -> (n, vocab)."""
        return losses.decode(self, self.transform(x), decoder_weight, self.bias)


class BertForMaskedLM(BertModel):
    """Masked-LM logits = mlm(hidden) with the decoder tied to embeddings.word (fastenc.models.losses.masked_lm):
    forward(ids, mask, types) -> (batch, seq, vocab), zeros at padding; positions= (bool (batch, seq) or int (n, 2))
    -> (n, vocab) there only; labels= int (batch, seq), -100 ignored -> MaskedLMOutput(loss, logits (n_labelled,
    vocab)), logits computed at the labelled tokens only. hf_forward gives transformers' shapes (accelerate)."""
    task = "masked_lm"

    def __init__(self, config: BertConfig):
        losses.check_tied(type(self).__name__, config)
        config = dataclasses.replace(config, add_pooling_layer=False)
        super().__init__(config)
        self.mlm = BertMLMHead(config)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """(n, hidden) packed hidden states -> (n, vocab) logits."""
        return self.mlm(x, self.embeddings.word.weight)

    def mlm_projection(self, x: torch.Tensor):
        """(transformed (n, hidden), decoder weight (vocab, hidden), decoder bias (vocab,)): predict(x) is
        transformed @ weight^T + bias (encode(output='sparse') fuses that product with its max)."""
        return self.mlm.transform(x), self.embeddings.word.weight, self.mlm.bias

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, *, positions=None):
        name = type(self).__name__
        if labels is not None:
            losses.check_mlm_labels(name, self.config.vocab_size, labels, losses.grid(input_ids))
        x, batch = self._encode(input_ids, attention_mask, token_type_ids)
        return losses.masked_lm(name, self.predict, x, batch, labels, positions)

    def hf_forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, num_items_in_batch=None):
        """transformers' BertForMaskedLM fields: logits (batch, seq, vocab) at every real token (with labels too),
        loss = mean cross-entropy over the labelled tokens (num_items_in_batch is not used, as there)."""
        name = type(self).__name__
        if labels is not None:
            losses.check_mlm_labels(name, self.config.vocab_size, labels, losses.grid(input_ids))
        x, batch = self._encode(input_ids, attention_mask, token_type_ids)
        out = losses.masked_lm(name, self.predict, x, batch, labels, dense=True)
        return {"logits": out} if labels is None else {"loss": out.loss, "logits": out.logits}


class BertForQuestionAnswering(BertModel):
    """qa_outputs(hidden) -> (start_logits, end_logits), each (batch, seq), zeros at padding.
    start_positions= / end_positions= int (batch,) -> QuestionAnsweringModelOutput(loss, start, end): transformers'
    loss, whose softmax runs over every column, padded ones included (their logits computed as transformers does,
    fastenc.models.columns), positions outside [0, seq) ignored."""
    task = "question_answering"

    def __init__(self, config: BertConfig):
        losses.check_qa_labels_count(type(self).__name__, config)
        config = dataclasses.replace(config, add_pooling_layer=False)
        super().__init__(config)
        self.qa_outputs = Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None,
                end_positions=None):
        return question_answering(self, input_ids, attention_mask, token_type_ids, start_positions, end_positions)


class BertForMultipleChoice(MultipleChoice, BertModel):
    """input_ids (batch, choices, seq) (attention_mask, token_type_ids alike) -> logits (batch, choices):
    classifier(drop(tanh(pooler(column 0)))) per choice, column 0 read as transformers does (padding or not);
    dropout classifier_dropout (hidden_dropout_prob when None). labels= int (batch,) ->
    MultipleChoiceModelOutput(loss, logits) (fastenc.models.multiple_choice)."""
    needs_pooler = True

    @property
    def choice_dropout(self) -> float:
        return _classifier_dropout(self.config)


def question_answering(model: BertModel, input_ids, attention_mask, token_type_ids, start_positions, end_positions):
    """The question-answering forward of a BERT-family model with a `qa_outputs` Linear(hidden, 2): (start, end)
    logits (batch, seq), zeros at padding, or with start/end positions transformers' output with its loss, whose
    softmax runs over the padded columns too (their logits computed as transformers does: `_run(padded=True)`)."""
    return losses.answer_spans(model, input_ids, start_positions, end_positions,
                              lambda padded: model._run(input_ids, attention_mask, token_type_ids, padded=padded),
                              model.qa_outputs)


def weight_map(cfg: BertConfig, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every BERT tensor (prefix: "bert." inside the head classes)."""
    p = prefix
    m: list[Entry] = [
        ("embeddings.word.weight", (f"{p}embeddings.word_embeddings.weight",), "copy"),
        ("embeddings.position.weight", (f"{p}embeddings.position_embeddings.weight",), "copy"),
        ("embeddings.token_type.weight", (f"{p}embeddings.token_type_embeddings.weight",), "copy"),
        *lin("embeddings.norm", f"{p}embeddings.LayerNorm"),
    ]
    for i in range(cfg.num_hidden_layers):
        f, h = f"layers.{i}", f"{p}encoder.layer.{i}"
        m += qkv(f"{f}.attn.Wqkv", tuple(f"{h}.attention.self.{n}" for n in ("query", "key", "value")))
        m += lin(f"{f}.attn.Wo", f"{h}.attention.output.dense")
        m += lin(f"{f}.attn_norm", f"{h}.attention.output.LayerNorm")
        m += lin(f"{f}.mlp.fc1", f"{h}.intermediate.dense")
        m += lin(f"{f}.mlp.fc2", f"{h}.output.dense")
        m += lin(f"{f}.mlp_norm", f"{h}.output.LayerNorm")
    if cfg.add_pooling_layer:
        m += lin("pooler", f"{p}pooler.dense")
    if task in ("sequence_classification", "token_classification", "multiple_choice"):
        m += lin("classifier", "classifier")
    if task == "question_answering":
        m += lin("qa_outputs", "qa_outputs")
    if task == "masked_lm":  # the decoder weight is embeddings.word's (tied; the checkpoint stores it once)
        m += lin("mlm.dense", "cls.predictions.transform.dense")
        m += lin("mlm.norm", "cls.predictions.transform.LayerNorm")
        m.append(("mlm.bias", ("cls.predictions.bias",), "copy"))
    return m


def pooler_override(task: str, has_pooler: bool) -> dict:
    """The base model has a pooler when the checkpoint holds one; of the heads sequence classification and multiple
    choice."""
    return {"add_pooling_layer": has_pooler if task == "base" else task in ("sequence_classification",
                                                                           "multiple_choice")}


def tiny_config(task: str = "base", hidden: int = 64, heads: int = 4, layers: int = 2, **kw):
    """A small transformers BertConfig for tests (Architecture.tiny_config; eager attention as the reference)."""
    import transformers

    return transformers.BertConfig(vocab_size=211, hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=heads, intermediate_size=2 * hidden + 8,
                                   max_position_embeddings=160, type_vocab_size=2,
                                   num_labels=2 if task == "question_answering" else 5,
                                   attn_implementation="eager", **kw)


ARCHITECTURE = Architecture(
    model_type="bert",
    config=BertConfig,
    heads=heads_of(BertModel, BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering,
                   BertForMaskedLM, BertForMultipleChoice),
    weight_map=weight_map,
    head_prefix="bert.",
    encoder_of=("BertForPreTraining", "BertForNextSentencePrediction"),
    config_overrides=pooler_override,
    lora_targets=("query", "value"),
    base_output="BaseModelOutputWithPoolingAndCrossAttentions",
    tiny_config=tiny_config,
)
