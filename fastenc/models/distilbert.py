"""DistilBERT encoder (Sanh et al. 2019) on packed tokens: word + position embeddings (no token types), LayerNorm,
post-norm blocks (BERT's block: one fused QKV GEMM for q_lin/k_lin/v_lin, out_lin, sa_layer_norm, lin1 -> act ->
lin2, output_layer_norm; every LayerNorm eps 1e-12), varlen attention; no pooler. Heads: sequence classification
(pre_classifier -> ReLU -> classifier on the first token), token classification, question answering (qa_outputs)
masked LM (vocab_transform -> act -> vocab_layer_norm -> vocab_projector tied to the word embeddings) and multiple
choice (pre_classifier -> ReLU -> classifier on each choice's column 0, fastenc.models.multiple_choice).

Usage: model(input_ids, attention_mask=None) -> last hidden state (batch, seq, dim), zeros at padded positions;
  return_packed=True -> (hidden (total_tokens, dim), PackedBatch). token_type_ids must be None (DistilBERT has no
  token-type embeddings). The position table is read from the checkpoint whether or not sinusoidal_pos_embds is
  set: transformers keeps it as a parameter, saves it and loads it as stored (it recomputes the sinusoids only when
  it initializes a model without weights).
Training: parameters require grad; model.train() turns on transformers' dropouts (dropout after the embedding norm
  and after lin2; attention_dropout on the attention probabilities; the out_lin output has none), seq_classif_dropout
  / dropout / qa_dropout before the classifiers; heads take labels= (start_positions= / end_positions=) and return
  transformers' output with the loss (fastenc.models.losses).
Parameter names (fastenc side of `weight_map`): embeddings.{word,position}.weight, embeddings.norm.*,
layers.i.{attn.Wqkv,attn.Wo,attn_norm,mlp.fc1,mlp.fc2,mlp_norm}.*, pre_classifier.*, classifier.*, qa_outputs.*,
vocab_transform.*, vocab_layer_norm.*, vocab_projector.* (its weight is embeddings.word.weight).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from fastenc.layers import LayerNorm, Linear, activation
from fastenc.layers.embedding import embedding, padding_row
from fastenc.layers.mlp import check_activation
from fastenc.lora import LoraMixin
from fastenc.quant.model import QuantMixin
from fastenc.models import losses
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.base import TextEncoderMixin, check_text_inputs, pack_text
from fastenc.models.bert import BertLayer, run_blocks, run_first_rows
from fastenc.models.columns import padded_first_rows, padded_positions
from fastenc.models.config import _Common, _num_labels, _pick
from fastenc.models.convert import Entry, lin, qkv
from fastenc.models.multiple_choice import MultipleChoice, column0
from fastenc.models.saving import SaveMixin

# transformers' DistilBertConfig.attribute_map: the common names -> DistilBERT's own.
_ALIASES = {"hidden_size": "dim", "num_attention_heads": "n_heads", "num_hidden_layers": "n_layers"}


@dataclass
class DistilBertConfig(_Common):
    """DistilBERT's config.json names (dim, n_layers, n_heads, hidden_dim, ...); the common names the shared code
    reads (hidden_size, num_hidden_layers, num_attention_heads, intermediate_size) follow them."""
    vocab_size: int = 30522
    dim: int = 768
    n_layers: int = 6
    n_heads: int = 12
    hidden_dim: int = 3072
    dropout: float = 0.1
    attention_dropout: float = 0.1
    seq_classif_dropout: float = 0.2
    qa_dropout: float = 0.1
    activation: str = "gelu"
    max_position_embeddings: int = 512
    sinusoidal_pos_embds: bool = False
    pad_token_id: int = 0
    tie_word_embeddings: bool = True
    model_type: str = "distilbert"

    FASTENC_ONLY = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")  # (not saved)
    layer_norm_eps = 1e-12  # (fixed in transformers' DistilBERT, not a config entry)

    def __post_init__(self):
        self.hidden_size, self.num_hidden_layers = self.dim, self.n_layers
        self.num_attention_heads, self.intermediate_size = self.n_heads, self.hidden_dim

    # BERT's names for the same settings (BertLayer reads these).
    @property
    def hidden_dropout_prob(self) -> float:
        return self.dropout

    @property
    def attention_probs_dropout_prob(self) -> float:
        return self.attention_dropout

    @property
    def hidden_act(self) -> str:
        return self.activation

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **override) -> "DistilBertConfig":
        d = dict(d)
        for alias, name in _ALIASES.items():
            if alias in d and name not in d:
                d[name] = d[alias]
        vals = _pick(cls, d, num_labels=_num_labels(d), **override)
        for name in cls.FASTENC_ONLY:
            vals.pop(name, None)
        cfg = cls(**vals)
        cfg._check()
        check_activation(cfg.activation)
        cfg.hf_config = d
        return cfg


class DistilBertEmbeddings(nn.Module):
    def __init__(self, cfg: DistilBertConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.position = nn.Embedding(cfg.max_position_embeddings, cfg.dim)
        self.norm = LayerNorm(cfg.dim, cfg.layer_norm_eps)
        self.dropout = cfg.dropout
        self.pad = padding_row(cfg.pad_token_id, cfg.vocab_size)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """ids, positions: packed (tokens,) -> LN(word[ids] + position[positions]): (tokens, dim)."""
        x = embedding(ids, self.word.weight, padding_idx=self.pad)
        x = self.norm(F.embedding(positions, self.position.weight), residual=x, return_residual=False)
        return F.dropout(x, self.dropout, training=True) if self.training and self.dropout > 0 else x


class DistilBertLayer(BertLayer):
    """BERT's post-norm block (inference: the residual adds inside the out_lin and lin2 GEMMs). In training
    DistilBERT has dropout after lin2 only, none on the attention output."""

    def dropouts(self) -> tuple[float, float]:
        return 0.0, self.dropout if self.training else 0.0


def _drop(module: nn.Module, x: torch.Tensor, p: float) -> torch.Tensor:
    return F.dropout(x, p, training=True) if module.training and p > 0 else x



class DistilBertModel(QuantMixin, LoraMixin, SaveMixin, TextEncoderMixin, nn.Module):
    task = "base"
    pooler = None  # (DistilBERT has no pooler)

    def __init__(self, config: DistilBertConfig):
        super().__init__()
        self.config = config
        self.embeddings = DistilBertEmbeddings(config)
        self.layers = nn.ModuleList(DistilBertLayer(config) for _ in range(config.n_layers))

    def _encode(self, input_ids, attention_mask=None, token_type_ids=None):
        """Embeddings + all layers on packed tokens. Returns (x (total, dim), PackedBatch)."""
        x, batch, _ = self._run(input_ids, attention_mask, token_type_ids)
        return x, batch

    def _run(self, input_ids, attention_mask=None, token_type_ids=None, column0: bool = False, padded: bool = False,
             first_only: bool = False):
        """(x (total, dim), PackedBatch, first): first (batch, dim) is the last hidden state at column 0 of each row
        when column0=True (None otherwise): the first real token's, or, where column 0 is padding, a padded query's
        as transformers computes it (it sees the row's real tokens and is no key itself). padded=True: first is
        instead (rows, cols, states (n, dim)) of every padded position, computed the same way (None without
        padding). first_only=True (without column0 / padded): x is (batch, dim), each sequence's first real token
        only, the last layer trimmed to those rows (bert.run_first_rows)."""
        cfg, name = self.config, type(self).__name__
        if token_type_ids is not None:
            raise ValueError(f"{name}: token_type_ids must be None (DistilBERT has no token-type embeddings), got "
                             f"a {type(token_type_ids).__name__}")
        input_ids, mask, _ = check_text_inputs(name, input_ids, attention_mask, None, cfg.vocab_size,
                                               cfg.max_position_embeddings)
        batch, ids, pos = pack_text(input_ids, mask)
        x = self.embeddings(ids, pos)
        if first_only and not (column0 or padded):
            return run_first_rows(self.layers, x, batch, pos)
        rows, cols = padded_positions(mask) if padded else (padded_first_rows(mask) if column0 else None, None)
        queries = None
        if rows is not None:  # the padded queries (column 0 or all), run beside the packed tokens
            cols = torch.zeros_like(rows) if cols is None else cols
            queries = (rows, cols, self.embeddings(input_ids[rows, cols], cols))
        return run_blocks(self.layers, x, batch, pos, queries, column0, padded)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, *, return_packed: bool = False):
        x, batch = self._encode(input_ids, attention_mask, token_type_ids)
        return (x, batch) if return_packed else batch.pad(x)


class DistilBertForSequenceClassification(DistilBertModel):
    """logits = classifier(drop(relu(pre_classifier(first real token)))): (batch, num_labels).
    labels= (batch,) int / float (see fastenc.models.losses) -> transformers' SequenceClassifierOutput(loss, logits)."""
    task = "sequence_classification"

    def __init__(self, config: DistilBertConfig):
        super().__init__(config)
        self.pre_classifier = Linear(config.dim, config.dim)
        self.classifier = Linear(config.dim, config.num_labels)

    def classify(self, first: torch.Tensor) -> torch.Tensor:
        """first (batch, dim), each row's first token -> (batch, num_labels)."""
        pooled = activation("relu", self.pre_classifier(first, with_bias=False), self.pre_classifier.output_bias())
        return self.classifier(_drop(self, pooled, self.config.seq_classif_dropout))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        return losses.classify_sequence(self, input_ids, attention_mask, token_type_ids, labels)


class DistilBertForTokenClassification(DistilBertModel):
    """logits = classifier(drop(hidden)): (batch, seq, num_labels), zeros at padded positions.
    labels= int (batch, seq), -100 ignored -> TokenClassifierOutput(loss, logits), loss over the real tokens."""
    task = "token_classification"

    def __init__(self, config: DistilBertConfig):
        super().__init__(config)
        self.classifier = Linear(config.dim, config.num_labels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        if labels is not None:
            losses.check_token_labels(type(self).__name__, self.config, labels, losses.grid(input_ids),
                                    attention_mask)
        x, batch = self._encode(input_ids, attention_mask, token_type_ids)
        packed = self.classifier(_drop(self, x, self.config.dropout))
        logits = batch.pad(packed)
        if labels is None:
            return logits
        loss = losses.cross_entropy(packed, batch.gather(labels.to(packed.device).reshape(batch.batch, batch.seq)))
        return losses.output(self.task, loss, logits)


class DistilBertForQuestionAnswering(DistilBertModel):
    """(start_logits, end_logits) = qa_outputs(drop(hidden)) split in two: each (batch, seq), zeros at padded
    positions. start_positions= / end_positions= int (batch,) -> QuestionAnsweringModelOutput(loss, start, end),
    loss = (CE(start) + CE(end)) / 2 over the (batch, seq) logits (fastenc.models.losses.qa_loss), the padded
    columns' logits computed as transformers does (their softmax includes them)."""
    task = "question_answering"

    def __init__(self, config: DistilBertConfig):
        if config.num_labels != 2:
            raise ValueError(f"{type(self).__name__}: config.num_labels must be 2 (start, end), got "
                             f"{config.num_labels}")
        super().__init__(config)
        self.qa_outputs = Linear(config.dim, config.num_labels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None,
                end_positions=None):
        return losses.answer_spans(self, input_ids, start_positions, end_positions,
                                  lambda padded: self._run(input_ids, attention_mask, token_type_ids, padded=padded),
                                  lambda x: self.qa_outputs(_drop(self, x, self.config.qa_dropout)))


class DistilBertForMaskedLM(DistilBertModel):
    """logits = vocab_projector(vocab_layer_norm(act(vocab_transform(hidden)))), the projector's weight the word
    embedding (tie_word_embeddings, as in transformers' checkpoints; untied when the config says so).

    forward(input_ids, attention_mask=None, token_type_ids=None, labels=None, *, positions=None):
      positions (bool (batch, seq) or int (n, 2) (row, col)) -> logits (n, vocab) at those tokens only, row-major;
      neither positions nor labels -> logits (batch, seq, vocab), zeros at padded positions;
      labels int (batch, seq), -100 ignored -> MaskedLMOutput(loss, logits (n_labelled, vocab)): logits only at the
      labelled real tokens (labels at padded positions are not read); with positions too, the labels at those
      positions are the targets."""
    task = "masked_lm"

    def __init__(self, config: DistilBertConfig):
        super().__init__(config)
        self.vocab_transform = Linear(config.dim, config.dim)
        self.vocab_layer_norm = LayerNorm(config.dim, config.layer_norm_eps)
        self.vocab_projector = Linear(config.dim, config.vocab_size)
        self._tie()

    def _tie(self) -> None:
        if self.config.tie_word_embeddings:
            self.vocab_projector.weight = self.embeddings.word.weight

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """As nn.Module's, then the decoder weight is the word embedding again (assign=True replaces both)."""
        out = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self._tie()
        return out

    def mlm_projection(self, h: torch.Tensor):
        """(transformed (n, dim), projector weight (vocab, dim), projector bias (vocab,) or None): the logits are
        transformed @ weight^T + bias (encode(output='sparse') fuses that product with its max)."""
        t = self.vocab_transform
        y = activation(self.config.activation, t(h, with_bias=False), t.output_bias(), inplace=True)
        return self.vocab_layer_norm(y), self.vocab_projector.weight, self.vocab_projector.bias

    def predict(self, h: torch.Tensor) -> torch.Tensor:
        """h (n, dim) -> (n, vocab) logits."""
        return self.vocab_projector(self.mlm_projection(h)[0])

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, *, positions=None):
        name = type(self).__name__
        if labels is not None:
            losses.check_mlm_labels(name, self.config.vocab_size, labels, losses.grid(input_ids))
        x, batch = self._encode(input_ids, attention_mask, token_type_ids)
        if positions is None and labels is None:
            return batch.pad(self.predict(x))
        target = None if labels is None else batch.gather(labels.to(x.device).reshape(batch.batch, batch.seq))
        if positions is not None:
            rows = losses.packed_rows(name, batch, positions)
        else:
            rows = (target != losses.IGNORE).nonzero().flatten()
        logits = self.predict(x.index_select(0, rows))
        if labels is None:
            return logits
        return losses.output(self.task, losses.cross_entropy(logits, target.index_select(0, rows)), logits)


class DistilBertForMultipleChoice(MultipleChoice, DistilBertModel):
    """input_ids (batch, choices, seq) (attention_mask alike) -> logits (batch, choices):
    classifier(drop(relu(pre_classifier(column 0)))) per choice, column 0 read as transformers does (padding or
    not), dropout seq_classif_dropout. labels= int (batch,) -> MultipleChoiceModelOutput(loss, logits)."""

    def __init__(self, config: DistilBertConfig):
        super().__init__(config)
        self.pre_classifier = Linear(config.dim, config.dim)

    def choice_pool(self, ids, mask, types) -> torch.Tensor:
        first = column0(self, ids, mask, types)
        return activation("relu", self.pre_classifier(first, with_bias=False), self.pre_classifier.output_bias())

    @property
    def choice_dropout(self) -> float:
        return self.config.seq_classif_dropout


def weight_map(cfg: DistilBertConfig, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every DistilBERT tensor (prefix: "distilbert." inside the heads).
    The tied masked-LM decoder weight maps from the word embedding (transformers' checkpoints do not store
    vocab_projector.weight; they do when tie_word_embeddings is false)."""
    p = prefix
    word = f"{p}embeddings.word_embeddings.weight"
    m: list[Entry] = []
    if task == "masked_lm":  # (first: the word embedding's own entry below is the one its name resolves to)
        m.append(("vocab_projector.weight", (word if cfg.tie_word_embeddings else "vocab_projector.weight",), "copy"))
    m += [("embeddings.word.weight", (word,), "copy"),
          ("embeddings.position.weight", (f"{p}embeddings.position_embeddings.weight",), "copy"),
          *lin("embeddings.norm", f"{p}embeddings.LayerNorm")]
    for i in range(cfg.n_layers):
        f, h = f"layers.{i}", f"{p}transformer.layer.{i}"
        m += qkv(f"{f}.attn.Wqkv", tuple(f"{h}.attention.{n}" for n in ("q_lin", "k_lin", "v_lin")))
        m += lin(f"{f}.attn.Wo", f"{h}.attention.out_lin")
        m += lin(f"{f}.attn_norm", f"{h}.sa_layer_norm")
        m += lin(f"{f}.mlp.fc1", f"{h}.ffn.lin1")
        m += lin(f"{f}.mlp.fc2", f"{h}.ffn.lin2")
        m += lin(f"{f}.mlp_norm", f"{h}.output_layer_norm")
    if task in ("sequence_classification", "multiple_choice"):
        m += lin("pre_classifier", "pre_classifier")
    if task in ("sequence_classification", "token_classification", "multiple_choice"):
        m += lin("classifier", "classifier")
    if task == "question_answering":
        m += lin("qa_outputs", "qa_outputs")
    if task == "masked_lm":
        m += [*lin("vocab_transform", "vocab_transform"), *lin("vocab_layer_norm", "vocab_layer_norm"),
              ("vocab_projector.bias", ("vocab_projector.bias",), "copy")]
    return m


def tiny_config(task: str = "base", hidden: int = 64, heads: int = 4, layers: int = 2, **kw):
    """A small transformers DistilBertConfig for tests (Architecture.tiny_config)."""
    import transformers

    kw.setdefault("num_labels", 2 if task == "question_answering" else 5)
    return transformers.DistilBertConfig(vocab_size=kw.pop("vocab_size", 211), dim=hidden, n_layers=layers,
                                         n_heads=heads, hidden_dim=2 * hidden + 8, max_position_embeddings=160,
                                         attn_implementation="eager", **kw)


ARCHITECTURE = Architecture(
    model_type="distilbert",
    config=DistilBertConfig,
    heads=heads_of(DistilBertModel, DistilBertForSequenceClassification, DistilBertForTokenClassification,
                   DistilBertForQuestionAnswering, DistilBertForMaskedLM, DistilBertForMultipleChoice),
    weight_map=weight_map,
    head_prefix="distilbert.",
    inputs=frozenset({"input_ids", "attention_mask", "return_dict", "num_items_in_batch"}),
    token_types=False,  # (transformers' DistilBERT forward takes no token_type_ids)
    lora_targets=("q_lin", "v_lin"),
    tiny_config=tiny_config,
)
