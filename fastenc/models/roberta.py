"""RoBERTa (Liu et al. 2019) on packed tokens: BERT's blocks (fastenc.models.bert) with RoBERTa's positions, its
classification head on the <s> token, question answering and the masked-LM head tied to the word embedding.

Positions as transformers' create_position_ids_from_input_ids: in each row, the running count of tokens that are
not padding_idx (pad_token_id), times that mask, plus padding_idx; real tokens start at padding_idx + 1, so a row
holds at most max_position_embeddings - padding_idx - 1 tokens (514 - 1 - 1 = 512 for roberta-base).

Usage: fastenc.from_hf(hf_roberta) / fastenc.from_pretrained(folder), or RobertaModel(RobertaConfig(...)).
  model(input_ids, attention_mask=None, token_type_ids=None) -> (batch, seq, hidden), zeros at padding.
Heads (transformers' names, parameter names of the fastenc side in `weight_map`):
  RobertaForSequenceClassification  out_proj(drop(tanh(dense(drop(<s>))))) -> (batch, num_labels); no pooler
  RobertaForTokenClassification     classifier(drop(hidden)) -> (batch, seq, num_labels)
  RobertaForQuestionAnswering       qa_outputs(hidden) -> (start_logits, end_logits), each (batch, seq)
  RobertaForMaskedLM                layer_norm(gelu(dense(hidden))) @ word_embedding^T + bias -> vocab logits
  RobertaForMultipleChoice          classifier(drop(tanh(pooler(column 0)))) per choice -> (batch, choices),
                                    dropout hidden_dropout_prob (fastenc.models.multiple_choice)
XLM-RoBERTa (fastenc.models.xlm_roberta) is the same network under its own names.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fastenc.layers import LayerNorm, Linear
from fastenc.layers.embedding import padding_row
from fastenc.layers.mlp import activation
from fastenc.models import losses
from fastenc.models.architecture import Architecture
from fastenc.models.bert import BertForTokenClassification, BertModel, _classifier_dropout, question_answering
from fastenc.models.bert import weight_map as bert_weight_map
from fastenc.models.config import BertConfig
from fastenc.models.convert import Entry, lin
from fastenc.models.multiple_choice import MultipleChoice


@dataclass
class RobertaConfig(BertConfig):
    """BERT's fields with RoBERTa's defaults: pad_token_id is the padding_idx of the positions."""
    vocab_size: int = 50265
    max_position_embeddings: int = 514
    type_vocab_size: int = 1
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 1
    model_type: str = "roberta"

    @property
    def max_tokens(self) -> int:
        """The most tokens a row can hold: positions run from padding_idx + 1 to max_position_embeddings - 1."""
        return self.max_position_embeddings - self.pad_token_id - 1

    @property
    def position_padding_idx(self) -> int | None:
        """The position table's padding_idx, as transformers' RobertaEmbeddings (its row gets no gradient)."""
        return padding_row(self.pad_token_id, self.max_position_embeddings)


class _RobertaPositions:
    """RoBERTa's position ids (mixed into each BERT model class) and its encode() length limit."""

    def _positions(self, input_ids, batch, ids, pos, rows, cols):
        """Position ids of the packed tokens (total,) and of the padded queries (n,) (None without): transformers'
        cumsum(ids != pad) * (ids != pad) + pad along each padded row (padded columns whose ids are not
        pad_token_id count, as there), gathered once; checked against the position table at the real tokens.
        (Four integer passes over the (batch, seq) grid: about 0.1 ms at 16 x 373; a running count on the packed
        tokens needs more, smaller ops, each sequence's start spread to its tokens, and took 2.5x as long.)"""
        pad = self.config.pad_token_id
        real = input_ids != pad
        grid = real.cumsum(1) * real + pad
        at = batch.gather(grid)
        self._check_positions(at)
        return at, None if rows is None else grid[rows, cols]

    def _check_positions(self, at: torch.Tensor) -> None:
        pad = self.config.pad_token_id
        if at.numel():
            hi = int(at.max())
            if hi >= self.config.max_position_embeddings:
                raise ValueError(f"{type(self).__name__}: input_ids has a row of {hi - pad} tokens that are not "
                                 f"padding (pad_token_id={pad}); position ids start at {pad + 1}, so the position "
                                 f"table (max_position_embeddings={self.config.max_position_embeddings}) holds at "
                                 f"most {self.config.max_tokens}")

    def load_tokenizer(self, folder) -> None:
        super().load_tokenizer(folder)
        if not self.encode_defaults.get("max_length"):  # truncate to what the position table holds
            object.__setattr__(self, "encode_defaults", {**self.encode_defaults, "max_length": self.config.max_tokens})


class RobertaModel(_RobertaPositions, BertModel):
    """The bare encoder (with the tanh pooler when the checkpoint has one)."""


class RobertaForTokenClassification(_RobertaPositions, BertForTokenClassification):
    """logits = classifier(drop(hidden)): (batch, seq, num_labels), zeros at padded positions (BERT's head)."""


class RobertaClassificationHead(nn.Module):
    """out_proj(drop(tanh(dense(drop(x))))): x (batch, hidden) -> (batch, num_labels)."""

    def __init__(self, cfg: RobertaConfig):
        super().__init__()
        self.dense = Linear(cfg.hidden_size, cfg.hidden_size)
        self.out_proj = Linear(cfg.hidden_size, cfg.num_labels)
        self.dropout = _classifier_dropout(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.dropout if self.training else 0.0
        x = torch.tanh(self.dense(F.dropout(x, p, training=True) if p > 0 else x))
        return self.out_proj(F.dropout(x, p, training=True) if p > 0 else x)


class RobertaForSequenceClassification(RobertaModel):
    """logits = classifier(<s>): the first real token's last hidden state (column 0 under accelerate), no pooler.
    labels= (batch,) int / float (fastenc.models.losses) -> SequenceClassifierOutput(loss, logits)."""
    task = "sequence_classification"

    def __init__(self, config: RobertaConfig):
        super().__init__(dataclasses.replace(config, add_pooling_layer=False))
        self.classifier = RobertaClassificationHead(self.config)

    def classify(self, first: torch.Tensor) -> torch.Tensor:
        """first (batch, hidden): each row's first token -> (batch, num_labels)."""
        return self.classifier(first)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        return losses.classify_sequence(self, input_ids, attention_mask, token_type_ids, labels)


class RobertaForQuestionAnswering(RobertaModel):
    """(start_logits, end_logits) = qa_outputs(hidden).unbind(-1): each (batch, seq), zeros at padded positions.
    start_positions / end_positions (batch,) -> QuestionAnsweringModelOutput with transformers' loss (positions
    outside [0, seq) ignored); the softmax of the loss runs over the padded columns too, their logits computed as
    transformers does (fastenc.models.bert.question_answering)."""
    task = "question_answering"

    def __init__(self, config: RobertaConfig):
        if config.num_labels != 2:  # (transformers' qa_outputs has num_labels rows, split into start and end)
            raise ValueError(f"{type(self).__name__}: num_labels must be 2 (start, end), got {config.num_labels}")
        super().__init__(dataclasses.replace(config, add_pooling_layer=False))
        self.qa_outputs = Linear(config.hidden_size, 2)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None,
                end_positions=None):
        return question_answering(self, input_ids, attention_mask, token_type_ids, start_positions, end_positions)


class RobertaLMHead(nn.Module):
    """layer_norm(gelu(dense(x))) @ decoder_weight^T + bias; the decoder weight is the word embedding (passed in),
    the bias this head's own."""

    def __init__(self, cfg: RobertaConfig):
        super().__init__()
        self.dense = Linear(cfg.hidden_size, cfg.hidden_size)
        self.layer_norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """x (n, hidden) -> (n, hidden): layer_norm(gelu(dense(x))), the states the decoder projects."""
        return self.layer_norm(activation("gelu", self.dense(x, with_bias=False), self.dense.bias),
                               return_residual=False)

    def forward(self, x: torch.Tensor, decoder_weight: torch.Tensor) -> torch.Tensor:
        """x (n, hidden) -> (n, vocab)."""
        return F.linear(self.transform(x), decoder_weight, self.bias)


class RobertaForMaskedLM(RobertaModel):
    """Masked-LM logits, computed only where needed (fastenc.models.losses.packed_rows):
    positions= bool (batch, seq) or int (n, 2) (row, col) -> logits (n, vocab) there, in row-major order;
    no positions, no labels -> (batch, seq, vocab), zeros at padding;
    labels= int (batch, seq), -100 ignored (labels at padded positions are not read) -> MaskedLMOutput(loss,
    logits (n_labelled, vocab)) at the labelled tokens, or at `positions` when given (the labels read there).
    The decoder weight is the word embedding itself (`decoder_weight`), as in the checkpoint."""
    task = "masked_lm"

    def __init__(self, config: RobertaConfig):
        super().__init__(dataclasses.replace(config, add_pooling_layer=False))
        self.lm_head = RobertaLMHead(self.config)

    @property
    def decoder_weight(self) -> nn.Parameter:
        return self.embeddings.word.weight

    def mlm_projection(self, x: torch.Tensor):
        """(transformed (n, hidden), decoder weight (vocab, hidden), decoder bias (vocab,)): the logits are
        transformed @ weight^T + bias (encode(output='sparse') fuses that product with its max)."""
        return self.lm_head.transform(x), self.decoder_weight, self.lm_head.bias

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, *, positions=None):
        name = type(self).__name__
        if labels is not None:
            losses.check_mlm_labels(name, self.config.vocab_size, labels, losses.grid(input_ids))
        x, batch = self._encode(input_ids, attention_mask, token_type_ids)
        packed_labels = None
        if labels is not None:
            packed_labels = batch.gather(labels.to(x.device).reshape(batch.batch, batch.seq))
        if positions is not None:
            rows = losses.packed_rows(name, batch, positions)
        elif labels is not None:
            rows = (packed_labels != losses.IGNORE).nonzero().flatten()
        else:
            return batch.pad(self.lm_head(x, self.decoder_weight))
        logits = self.lm_head(x.index_select(0, rows), self.decoder_weight)
        if labels is None:
            return logits
        return losses.output(self.task, losses.cross_entropy(logits, packed_labels[rows]), logits)


class RobertaForMultipleChoice(MultipleChoice, RobertaModel):
    """input_ids (batch, choices, seq) (attention_mask alike) -> logits (batch, choices): classifier(drop(tanh(
    pooler(column 0)))) per choice, column 0 read as transformers does (padding or not), dropout
    hidden_dropout_prob. labels= int (batch,) -> MultipleChoiceModelOutput(loss, logits)."""
    needs_pooler = True


def weight_map(cfg: RobertaConfig, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name (prefix "roberta." inside the head classes). The masked-LM decoder is
    the word embedding: transformers' state_dict repeats it (and the bias) as lm_head.decoder.*, its checkpoints
    do not, so the map lists them once, under the names the checkpoint stores."""
    m = bert_weight_map(cfg, "base", prefix)
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


def pooler_override(task: str, has_pooler: bool) -> dict:
    """The base model has a pooler when the checkpoint holds one; the multiple-choice head always (its pooling)."""
    return {"add_pooling_layer": (has_pooler and task == "base") or task == "multiple_choice"}


HEADS = {"base": RobertaModel, "sequence_classification": RobertaForSequenceClassification,
         "token_classification": RobertaForTokenClassification, "question_answering": RobertaForQuestionAnswering,
         "masked_lm": RobertaForMaskedLM, "multiple_choice": RobertaForMultipleChoice}


def tiny_config_of(family: str):
    """Architecture.tiny_config of RoBERTa or a family with its layout (`family`: the transformers name prefix,
    "Roberta", "XLMRoberta"): pad_token_id 1 (positions start at 2); a 160-row position table holds 158 tokens;
    one token type."""
    def tiny_config(task: str = "base", hidden: int = 64, heads: int = 4, layers: int = 2, vocab: int = 211, **kw):
        import transformers

        return getattr(transformers, f"{family}Config")(
            vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
            intermediate_size=2 * hidden + 8, max_position_embeddings=160, type_vocab_size=1, pad_token_id=1,
            bos_token_id=0, eos_token_id=2, num_labels=2 if task == "question_answering" else 5,
            attn_implementation="eager", **kw)

    return tiny_config


def architecture_of(model_type: str, config: type, classes: dict, family: str) -> Architecture:
    """The Architecture record of RoBERTa or a family with its layout (fastenc classes per task, their
    transformers names are the fastenc class names; `family`: their prefix, for tiny_config_of)."""
    return Architecture(
        model_type=model_type,
        config=config,
        heads={task: (cls, cls.__name__) for task, cls in classes.items()},
        weight_map=weight_map,
        head_prefix="roberta.",
        config_overrides=pooler_override,
        lora_targets=("query", "value"),
        pooling="mean",
        base_output="BaseModelOutputWithPoolingAndCrossAttentions",
        tiny_config=tiny_config_of(family),
    )


ARCHITECTURE = architecture_of("roberta", RobertaConfig, HEADS, "Roberta")
