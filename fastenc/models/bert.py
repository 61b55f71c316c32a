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
  classifier_dropout); heads take labels= and return transformers' output with the loss (fastenc.models.heads).
  Without autograd recording (torch.no_grad / inference_mode) and without dropout, the residual adds run in
  place inside the GEMMs; otherwise every step makes new tensors.
Parameter names (fastenc side of the weight map, `weight_map` below): embeddings.{word,position,token_type}.weight,
embeddings.norm.*, layers.i.attn.Wqkv.*, layers.i.attn.Wo.*, layers.i.attn_norm.*, layers.i.mlp.fc1.*,
layers.i.mlp.fc2.*, layers.i.mlp_norm.*, pooler.*, classifier.*.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from fastenc.layers import MLP, LayerNorm, Linear, SelfAttention
from fastenc.lora import LoraMixin
from fastenc.models import heads
from fastenc.models.architecture import Architecture
from fastenc.models.convert import Entry, lin, qkv
from fastenc.models.saving import SaveMixin
from fastenc.models.base import TextEncoderMixin, check_text_inputs, first_real, pack_text
from fastenc.models.columns import column_attention, padded_first_rows
from fastenc.models.config import BertConfig


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.dropout = cfg.hidden_dropout_prob

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, types: torch.Tensor | None) -> torch.Tensor:
        """ids, positions, types: packed (tokens,) -> (tokens, hidden)."""
        x = F.embedding(ids, self.word.weight)
        if types is None:
            x = x + self.token_type.weight[0]
        else:
            x = x + F.embedding(types, self.token_type.weight)
        x = self.norm(F.embedding(positions, self.position.weight), residual=x, return_residual=False)
        return F.dropout(x, self.dropout, training=True) if self.training and self.dropout > 0 else x


class BertLayer(nn.Module):
    """Post-norm block: x = LN(x + drop(attn(x))); x = LN(x + drop(mlp(x))). Inference (no autograd recording, no
    dropout): the residual add happens inside the Wo and fc2 GEMMs (x += o Wo^T, accumulated into x once the QKV
    projection has read it), and the bias of each of those linears inside the LayerNorm that follows; the norms
    write only their output. Training: the add and the bias go into the LayerNorm (residual=, input_bias=),
    nothing is overwritten."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        h = cfg.hidden_size
        self.dropout = cfg.hidden_dropout_prob
        self.attn = SelfAttention(h, cfg.num_attention_heads, bias=True, dropout=cfg.attention_probs_dropout_prob)
        self.attn_norm = LayerNorm(h, cfg.layer_norm_eps)
        self.mlp = MLP(h, cfg.intermediate_size, cfg.hidden_act)
        self.mlp_norm = LayerNorm(h, cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        """x: (tokens, hidden), a buffer of this model's own (the embeddings' or the previous layer's output): it
        is overwritten unless autograd records the call or dropout is on."""
        o = self.attn.attend(x, cu_seqlens, max_seqlen)
        p = self.dropout if self.training else 0.0
        if not torch.is_grad_enabled() and p == 0:
            self.attn.Wo.accumulate_(o, x)
            x = self.attn_norm(x, input_bias=self.attn.Wo.output_bias())
            self.mlp.fc2.accumulate_(self.mlp.hidden(x), x)
            return self.mlp_norm(x, input_bias=self.mlp.fc2.output_bias())
        x = _add_norm(self.attn_norm, self.attn.Wo, o, x, p)
        return _add_norm(self.mlp_norm, self.mlp.fc2, self.mlp.hidden(x), x, p)


def _add_norm(norm: LayerNorm, linear: Linear, y: torch.Tensor, residual: torch.Tensor, p: float) -> torch.Tensor:
    """norm(dropout(linear(y)) + residual): the linear's bias fused into the norm when there is no dropout."""
    if p > 0:
        return norm(F.dropout(linear(y), p, training=True), residual=residual, return_residual=False)
    return norm(linear(y, with_bias=False), residual=residual, input_bias=linear.output_bias(),
                return_residual=False)


class BertModel(LoraMixin, SaveMixin, TextEncoderMixin, nn.Module):
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

    def _run(self, input_ids, attention_mask=None, token_type_ids=None, column0: bool = False):
        """(x (total, hidden), PackedBatch, first): first (batch, hidden) is the last hidden state at column 0 of
        each row when column0=True (None otherwise): the first real token's, or, where column 0 is padding, a
        padded query's as transformers computes it (it sees the row's real tokens and is no key itself)."""
        cfg = self.config
        input_ids, mask, types = check_text_inputs(type(self).__name__, input_ids, attention_mask, token_type_ids,
                                                   cfg.vocab_size, cfg.max_position_embeddings, cfg.type_vocab_size)
        batch, ids, pos = pack_text(input_ids, mask)
        if types is not None:
            types = types.to(input_ids.device)
        x = self.embeddings(ids, self._positions(input_ids, batch, pos),
                            None if types is None else batch.gather(types))
        rows = padded_first_rows(mask) if column0 else None
        if rows is not None:  # the padded column-0 queries, run beside the packed tokens
            zero = torch.zeros_like(rows)
            col0 = input_ids[rows, :1]
            xg = self.embeddings(col0[:, 0], self._positions(col0, *pack_text(col0, None)[::2]),
                                 None if types is None else types[rows, 0])
        for layer in self.layers:
            if rows is not None:  # (before `layer` overwrites x)
                o = column_attention(layer.attn, xg, rows, zero, x, batch.cu_seqlens, pos)
                xg = layer.attn_norm(layer.attn.Wo(o), residual=xg, return_residual=False)
                xg = layer.mlp_norm(layer.mlp(xg), residual=xg, return_residual=False)
            x = layer(x, batch.cu_seqlens, batch.max_seqlen)
        first = None
        if column0:
            first = batch.first_tokens(x)
            if rows is not None:
                first = first.index_copy(0, rows, xg.to(first.dtype))
        return x, batch, first

    def _positions(self, input_ids: torch.Tensor, batch, columns: torch.Tensor) -> torch.Tensor:
        """Position ids of the packed tokens (total,) for the position embedding. BERT: each token's column in
        the padded (batch, seq) grid (`columns`); an architecture with other positions overrides this."""
        return columns

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
    labels= (batch,) int / float (see fastenc.models.heads) -> transformers' SequenceClassifierOutput(loss, logits)."""
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
        name = type(self).__name__
        kind = None if labels is None else heads.check_sequence_labels(name, self.config, labels, heads.grid(input_ids)[0])
        x, batch = self._encode(input_ids, attention_mask, token_type_ids)
        logits = self.classify(batch.first_tokens(x))
        if labels is None:
            return logits
        return heads.output(self.task, heads.sequence_loss(self.config, kind, logits, labels), logits)


class BertForTokenClassification(BertModel):
    """logits = classifier(drop(hidden)): (batch, seq, num_labels), zeros at padded positions.
    labels= int (batch, seq), -100 ignored -> transformers' TokenClassifierOutput(loss, logits); the loss is taken
    over the packed tokens (labels at padded positions are not read)."""
    task = "token_classification"

    def __init__(self, config: BertConfig):
        config = dataclasses.replace(config, add_pooling_layer=False)
        super().__init__(config)
        self.classifier = Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        if labels is not None:
            heads.check_token_labels(type(self).__name__, self.config, labels, heads.grid(input_ids))
        x, batch = self._encode(input_ids, attention_mask, token_type_ids)
        p = _classifier_dropout(self.config) if self.training else 0.0
        packed = self.classifier(F.dropout(x, p, training=True) if p > 0 else x)
        logits = batch.pad(packed)
        if labels is None:
            return logits
        loss = heads.cross_entropy(packed, batch.gather(labels.to(packed.device).reshape(batch.batch, batch.seq)))
        return heads.output(self.task, loss, logits)


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
    if task in ("sequence_classification", "token_classification"):
        m += lin("classifier", "classifier")
    return m


def pooler_override(task: str, has_pooler: bool) -> dict:
    """The base model has a pooler when the checkpoint holds one; of the heads only sequence classification."""
    return {"add_pooling_layer": has_pooler if task == "base" else task == "sequence_classification"}


ARCHITECTURE = Architecture(
    model_type="bert",
    config=BertConfig,
    heads={"base": (BertModel, "BertModel"),
           "sequence_classification": (BertForSequenceClassification, "BertForSequenceClassification"),
           "token_classification": (BertForTokenClassification, "BertForTokenClassification")},
    weight_map=weight_map,
    head_prefix="bert.",
    encoder_of=("BertForMaskedLM", "BertForPreTraining", "BertForNextSentencePrediction"),
    config_overrides=pooler_override,
    lora_targets=("query", "value"),
    base_output="BaseModelOutputWithPoolingAndCrossAttentions",
)
