"""ELECTRA discriminator (Clark et al. 2020) on packed tokens: BERT's word + position + token-type embeddings and
their LayerNorm at embedding_size, a projection to hidden_size when the two differ (embeddings_project), then
BERT's post-LayerNorm blocks (fastenc.models.bert.BertLayer); no pooler. Heads as transformers' Electra* classes.

Usage: model = ElectraModel(ElectraConfig(...)) or fastenc.from_hf(hf_electra) / fastenc.from_pretrained(folder)
  (ElectraModel and the head classes; a saved ElectraForPreTraining or ElectraForMaskedLM loads as the encoder,
  its discriminator / generator head dropped); model(input_ids, attention_mask=None, token_type_ids=None) ->
  last hidden state (batch, seq, hidden), zeros at padded positions; return_packed=True -> (packed, PackedBatch).
Heads:
  sequence classification  ElectraClassificationHead on the first real token: out_proj(drop(gelu(dense(drop(x)))))
                           (exact GELU whatever hidden_act is, as transformers' head) -> (batch, num_labels)
  token classification     classifier(drop(hidden)) -> (batch, seq, num_labels), zeros at padding
  question answering       qa_outputs(hidden) -> (start_logits, end_logits), each (batch, seq), zeros at padding
  multiple choice          classifier(sequence_summary(hidden)) per choice -> (batch, choices): transformers'
                           ElectraSequenceSummary, the summary_* fields of the config (summary_type 'first': column
                           0, 'last' / 'cls_index' without an index: the last column, 'mean': every column, padded
                           ones included and computed as transformers does; first dropout, projection (summary_use_proj),
                           summary_activation, last dropout), fastenc.models.multiple_choice
Training and labels as BERT's heads (fastenc.models.losses). The question-answering loss reads the zero logits at
padded positions as transformers reads its own (nonzero) logits there: with padding it differs from
transformers' loss by that; without padding it is the same.
Parameter names (fastenc side of `weight_map`): BERT's embeddings.* (at embedding_size), embeddings.project.*
(<-> embeddings_project.*), layers.i.*, classifier.* (classifier.dense / classifier.out_proj for sequence
classification), qa_outputs.*, summary.* (<-> sequence_summary.summary.*).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from fastenc.layers import Linear
from fastenc.layers.mlp import activation, check_activation
from fastenc.models import bert
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.config import _Common, _num_labels, _pick
from fastenc.models.convert import Entry, lin
from fastenc.models.multiple_choice import MultipleChoice, column0, padded_hidden


@dataclass
class ElectraConfig(_Common):
    """ELECTRA: BERT's embeddings at embedding_size (projected to hidden_size), BERT's blocks, no pooler.
    Defaults are transformers' ElectraConfig's (electra-small's encoder shape)."""
    vocab_size: int = 30522
    embedding_size: int = 128
    hidden_size: int = 256
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    classifier_dropout: float | None = None  # None: hidden_dropout_prob
    # ElectraSequenceSummary's (the multiple-choice head's pooling; transformers' defaults)
    summary_type: str = "first"
    summary_use_proj: bool = True
    summary_activation: str | None = "gelu"
    summary_first_dropout: float = 0.0
    summary_last_dropout: float = 0.1
    summary_proj_to_labels: bool = False
    add_pooling_layer: bool = False  # (BERT's field, read by the shared code: ELECTRA has no pooler)
    model_type: str = "electra"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **override) -> "ElectraConfig":
        pet = d.get("position_embedding_type", "absolute")
        if pet not in (None, "absolute"):
            raise ValueError(f"ElectraConfig: position_embedding_type must be 'absolute', got {pet!r}")
        if d.get("is_decoder") or d.get("add_cross_attention"):
            raise ValueError("ElectraConfig: decoder ELECTRA (is_decoder / add_cross_attention) is not supported")
        cfg = cls(**_pick(cls, d, num_labels=_num_labels(d), **override))
        if "summary_activation" in d and "summary_activation" not in override:  # (None: no activation)
            cfg.summary_activation = d["summary_activation"]
        cfg._check()
        if not isinstance(cfg.embedding_size, int) or cfg.embedding_size < 1:
            raise ValueError(f"ElectraConfig: embedding_size must be a positive int, got {cfg.embedding_size!r}")
        cfg.hf_config = dict(d)
        return cfg


class ElectraEmbeddings(bert.BertEmbeddings):
    """BERT's embeddings at embedding_size, then `project` (embedding_size -> hidden_size) when the sizes differ
    (None otherwise). forward(ids, positions, types): packed (tokens,) -> (tokens, hidden)."""

    def __init__(self, cfg: ElectraConfig):
        super().__init__(dataclasses.replace(cfg, hidden_size=cfg.embedding_size))
        e, h = cfg.embedding_size, cfg.hidden_size
        self.project = Linear(e, h) if e != h else None

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, types: torch.Tensor | None) -> torch.Tensor:
        x = super().forward(ids, positions, types)
        return x if self.project is None else self.project(x)


class ElectraModel(bert.BertModel):
    """The discriminator's encoder: BertModel's forward, _encode and _run over ElectraEmbeddings; no pooler."""
    task = "base"

    def __init__(self, config: ElectraConfig):
        nn.Module.__init__(self)  # (BertModel's modules, with ELECTRA's embeddings and no pooler)
        self.config = config
        self.embeddings = ElectraEmbeddings(config)
        self.layers = nn.ModuleList(bert.BertLayer(config) for _ in range(config.num_hidden_layers))
        self.pooler = None


class ElectraClassificationHead(nn.Module):
    """out_proj(drop(gelu(dense(drop(first))))): first (batch, hidden) -> (batch, num_labels); exact GELU as
    transformers' head (not config.hidden_act)."""

    def __init__(self, cfg: ElectraConfig):
        super().__init__()
        self.dense = Linear(cfg.hidden_size, cfg.hidden_size)
        self.out_proj = Linear(cfg.hidden_size, cfg.num_labels)
        self.dropout = cfg.hidden_dropout_prob if cfg.classifier_dropout is None else cfg.classifier_dropout

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        p = self.dropout if self.training else 0.0
        x = F.dropout(first, p, training=True) if p > 0 else first
        x = activation("gelu", self.dense(x, with_bias=False), self.dense.output_bias())
        return self.out_proj(F.dropout(x, p, training=True) if p > 0 else x)


class ElectraForSequenceClassification(ElectraModel):
    """logits = classifier(first real token): (batch, num_labels). labels= as BertForSequenceClassification."""
    task = "sequence_classification"
    forward = bert.BertForSequenceClassification.forward

    def __init__(self, config: ElectraConfig):
        super().__init__(config)
        self.classifier = ElectraClassificationHead(config)

    def classify(self, first: torch.Tensor) -> torch.Tensor:
        """The classification head on first (batch, hidden), each row's first token."""
        return self.classifier(first)


class ElectraForTokenClassification(ElectraModel):
    """logits = classifier(drop(hidden)): (batch, seq, num_labels), zeros at padded positions. labels= as
    BertForTokenClassification."""
    task = "token_classification"
    forward = bert.BertForTokenClassification.forward

    def __init__(self, config: ElectraConfig):
        super().__init__(config)
        self.classifier = Linear(config.hidden_size, config.num_labels)


class ElectraForQuestionAnswering(ElectraModel):
    """(start_logits, end_logits) = qa_outputs(hidden) split in two: each (batch, seq), zeros at padded positions.
    start_positions= / end_positions= int (batch,) -> transformers' QuestionAnsweringModelOutput with the loss
    (fastenc.models.bert.question_answering: the loss's softmax runs over the padded columns too, as transformers')."""
    task = "question_answering"

    def __init__(self, config: ElectraConfig):
        if config.num_labels != 2:
            raise ValueError(f"ElectraForQuestionAnswering: num_labels must be 2 (start and end logits), got "
                             f"{config.num_labels}")
        super().__init__(config)
        self.qa_outputs = Linear(config.hidden_size, 2)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None, end_positions=None):
        return bert.question_answering(self, input_ids, attention_mask, token_type_ids, start_positions,
                                       end_positions)


_SUMMARIES = ("first", "last", "mean", "cls_index")


class ElectraForMultipleChoice(MultipleChoice, ElectraModel):
    """input_ids (batch, choices, seq) (attention_mask, token_type_ids alike) -> logits (batch, choices):
    classifier(summary) per choice, summary = last_drop(act(summary(first_drop(pick(hidden))))) as transformers'
    ElectraSequenceSummary: pick is column 0 (summary_type 'first'), the last column ('last'; 'cls_index', which
    transformers reads as the last column without a cls_index) or the mean over every column ('mean'), padding or
    not, the padded columns' states as transformers computes them. labels= int (batch,) ->
    MultipleChoiceModelOutput(loss, logits)."""

    def __init__(self, config: ElectraConfig):
        name = type(self).__name__
        if config.summary_type not in _SUMMARIES:
            raise ValueError(f"{name}: summary_type must be one of {_SUMMARIES}, got {config.summary_type!r}")
        width = config.hidden_size
        if config.summary_use_proj and config.summary_proj_to_labels and config.num_labels > 0:
            width = config.num_labels
        if width != config.hidden_size:
            raise ValueError(f"{name}: summary_proj_to_labels=True projects the summary to num_labels "
                             f"({config.num_labels}) values but the classifier reads hidden_size "
                             f"({config.hidden_size})")
        if config.summary_activation:
            check_activation(config.summary_activation)
        super().__init__(config)
        self.summary = Linear(config.hidden_size, width) if config.summary_use_proj else None

    def choice_pool(self, ids, mask, types) -> torch.Tensor:
        cfg = self.config
        if cfg.summary_type == "first":
            x = column0(self, ids, mask, types)
        else:
            hidden = padded_hidden(self, ids, mask, types)
            x = hidden.mean(dim=1) if cfg.summary_type == "mean" else hidden[:, -1]
        p = cfg.summary_first_dropout if self.training else 0.0
        if p > 0:
            x = F.dropout(x, p, training=True)
        if self.summary is not None:
            if cfg.summary_activation:
                return activation(cfg.summary_activation, self.summary(x, with_bias=False), self.summary.output_bias())
            return self.summary(x)
        return activation(cfg.summary_activation, x) if cfg.summary_activation else x

    @property
    def choice_dropout(self) -> float:
        return self.config.summary_last_dropout


def weight_map(cfg: ElectraConfig, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every ELECTRA tensor (prefix: "electra." inside the head classes):
    BERT's embeddings and blocks, embeddings_project, and the head."""
    m = bert.weight_map(cfg, "base", prefix)
    if cfg.embedding_size != cfg.hidden_size:
        m += lin("embeddings.project", f"{prefix}embeddings_project")
    if task == "sequence_classification":
        m += lin("classifier.dense", "classifier.dense") + lin("classifier.out_proj", "classifier.out_proj")
    elif task == "token_classification":
        m += lin("classifier", "classifier")
    elif task == "question_answering":
        m += lin("qa_outputs", "qa_outputs")
    elif task == "multiple_choice":
        if cfg.summary_use_proj:
            m += lin("summary", "sequence_summary.summary")
        m += lin("classifier", "classifier")
    return m


def tiny_config(task: str = "base", hidden: int = 64, heads: int = 4, layers: int = 2, embedding: int = 48, **kw):
    """A small transformers ElectraConfig for tests (Architecture.tiny_config): embedding_size != hidden_size, so
    the embeddings_project layer is exercised; question answering has 2 labels."""
    import transformers

    kw.setdefault("num_labels", 2 if task == "question_answering" else 5)
    return transformers.ElectraConfig(vocab_size=211, embedding_size=embedding, hidden_size=hidden,
                                      num_hidden_layers=layers, num_attention_heads=heads,
                                      intermediate_size=2 * hidden + 8, max_position_embeddings=160,
                                      type_vocab_size=2, attn_implementation="eager", **kw)


ARCHITECTURE = Architecture(
    model_type="electra",
    config=ElectraConfig,
    heads=heads_of(ElectraModel, ElectraForSequenceClassification, ElectraForTokenClassification,
                   ElectraForQuestionAnswering, ElectraForMultipleChoice),
    weight_map=weight_map,
    head_prefix="electra.",
    encoder_of=("ElectraForPreTraining", "ElectraForMaskedLM"),
    lora_targets=("query", "value"),
    base_output="BaseModelOutputWithPastAndCrossAttentions",
    tiny_config=tiny_config,
)
