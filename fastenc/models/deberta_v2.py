"""DeBERTa-v2 and DeBERTa-v3 (model_type "deberta-v2"): the base model and the heads over the encoder of
fastenc.models.deberta_v2_encoder (its embeddings, disentangled attention and blocks), the weight map both ways and
the architecture record. The DeBERTa-v1 model type ("deberta": a fused in_proj, its own LayerNorm) is not served.

Usage: fastenc.from_hf(hf_deberta) / fastenc.from_pretrained(folder), or DebertaV2Model(DebertaV2Config(...));
  model(input_ids, attention_mask=None, token_type_ids=None) -> (batch, seq, hidden), zeros at padding.
Heads (transformers' names):
  DebertaV2ForSequenceClassification  classifier(drop(act(pooler(drop(first token))))) (ContextPooler: dropout
                                      pooler_dropout, pooler_hidden_act; then the classifier's dropout cls_dropout,
                                      else hidden_dropout_prob); without a problem_type the loss is transformers'
                                      DeBERTa one (negative labels ignored, soft labels)
  DebertaV2ForTokenClassification     classifier(drop(hidden))
  DebertaV2ForQuestionAnswering       qa_outputs(hidden) -> (start_logits, end_logits)
  DebertaV2ForMaskedLM                legacy (config.legacy, transformers' default): cls.predictions, LayerNorm at
                                      embedding_size, decoder tied to the word embedding; legacy False:
                                      lm_predictions.lm_head at hidden_size, @ word embedding^T + bias
  DebertaV2ForMultipleChoice          input_ids (batch, choices, seq) -> (batch, choices), column 0 pooled as
                                      transformers reads it
The fastenc forward of the sequence classifier pools each row's first real token (as every fastenc classifier);
hf_forward (fastenc.accelerate) reads column 0 as transformers does, padding or not.
Training: dropout where transformers has it (embeddings, the relative embeddings per layer, attention
probabilities, the attention and MLP outputs, the pooler and classifier); labels -> transformers' output types.
Parameter names (fastenc side of `weight_map`): embeddings.{word,position,token_type}.weight,
embeddings.project.weight, embeddings.norm.*, rel.weight, rel_norm.*, layers.i.attn.{Wqkv,pos_key,pos_query,Wo}.*,
layers.i.attn_norm.*, layers.i.mlp.{fc1,fc2}.*, layers.i.mlp_norm.*, pooler.*, classifier.*, qa_outputs.*,
mlm.{dense,norm}.*, mlm.bias.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fastenc.layers import Linear
from fastenc.layers.mlp import activation
from fastenc.models import bert, losses
from fastenc.models.albert import AlbertMLMHead
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.convert import Entry, lin, qkv
from fastenc.models.deberta_v2_encoder import DebertaV2Config, DebertaV2Encoder
from fastenc.models.multiple_choice import MultipleChoice, column0

__all__ = ["DebertaV2Config", "DebertaV2Model", "DebertaV2ForSequenceClassification",
           "DebertaV2ForTokenClassification", "DebertaV2ForQuestionAnswering", "DebertaV2ForMaskedLM",
           "DebertaV2ForMultipleChoice", "weight_map", "tiny_config", "ARCHITECTURE"]

class DebertaV2Model(DebertaV2Encoder):
    """The bare encoder: model(ids, mask, types) -> (batch, seq, hidden), zeros at padding."""

    def hf_forward(self, input_ids, attention_mask=None, token_type_ids=None):
        """transformers' DebertaV2Model output fields: last_hidden_state with column 0 as transformers computes
        it (the row's padded state where column 0 is padding), zeros at the other padded positions."""
        x, batch, first = self._run(input_ids, attention_mask, token_type_ids, column0=True)
        hidden = batch.pad(x)
        if batch.indices is not None:
            hidden[:, 0] = first  # (a new tensor: padding was re-inserted)
        return {"last_hidden_state": hidden}


def _drop(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    return F.dropout(x, p, training=True) if training and p > 0 else x


class _Pooled:
    """ContextPooler + classifier: classifier(drop(act(pooler(drop(first))))) and DeBERTa's sequence loss."""

    def context(self, first: torch.Tensor) -> torch.Tensor:
        """The ContextPooler: act(pooler(drop(first))), first (n, hidden) -> (n, hidden)."""
        cfg = self.config
        x = _drop(first, cfg.pooler_dropout, self.training)
        return activation(cfg.pooler_hidden_act, self.pooler(x, with_bias=False), self.pooler.output_bias())

    def classify(self, first: torch.Tensor) -> torch.Tensor:
        """first (n, hidden): each row's first token -> (n, classifier outputs)."""
        cfg = self.config
        p = cfg.hidden_dropout_prob if cfg.cls_dropout is None else cfg.cls_dropout
        return self.classifier(_drop(self.context(first), p, self.training))


def check_labels(name: str, config, labels, batch: int) -> str | None:
    """Validate sequence-classification labels: under a set problem_type as every fastenc classifier (returns
    it); without one as transformers' DeBERTa reads them (returns None): one label -> (batch,) float; int (batch,)
    class indices, a negative one ignored; float (batch, num_labels) soft labels."""
    if config.problem_type is not None:
        return losses.check_sequence_labels(name, config, labels, batch)
    if not isinstance(labels, torch.Tensor):
        raise ValueError(f"{name}: labels must be a tensor, got {type(labels).__name__}")
    n, shape = config.num_labels, tuple(labels.shape)
    if n == 1 or labels.dim() == 1 or labels.shape[-1] == 1:
        if labels.numel() != batch or labels.dim() > 2:
            raise ValueError(f"{name}: labels must have shape ({batch},), got {shape}")
        if n > 1:
            if labels.is_floating_point():
                raise ValueError(f"{name}: labels must be an integer tensor of class indices, got {labels.dtype}")
            if labels.numel() and int(labels.max()) >= n:
                raise ValueError(f"{name}: labels must be class indices < {n} (negative: ignored), got "
                                 f"{int(labels.max())}")
        elif not labels.is_floating_point():
            raise ValueError(f"{name}: labels must be a float tensor for one label (regression), got {labels.dtype}")
        return None
    if shape != (batch, n) or not labels.is_floating_point():
        raise ValueError(f"{name}: labels must be (batch,) class indices or float ({batch}, {n}) soft labels, got "
                         f"{labels.dtype} {shape}")
    return None


def sequence_loss(config, kind: str | None, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """transformers' DebertaV2ForSequenceClassification loss: under a problem_type the usual one; without, MSE
    for one label, cross-entropy over the rows whose label is >= 0 (zero when none is), or soft-label
    cross-entropy -(log_softmax(logits) * labels).sum(-1).mean() for float (batch, num_labels) labels."""
    if kind is not None:
        return losses.sequence_loss(config, kind, logits, labels)
    labels = labels.to(logits.device)
    if config.num_labels == 1:
        return F.mse_loss(logits.view(-1).to(labels.dtype), labels.view(-1))  # (logits flattened by the caller)
    if labels.dim() == 1 or labels.shape[-1] == 1:
        labels = labels.reshape(-1)
        keep = labels >= 0
        if not bool(keep.any()):
            return (logits.sum() * 0).to(logits.dtype)
        return F.cross_entropy(logits[keep].float(), labels[keep].long())
    return -(torch.log_softmax(logits, -1) * labels).sum(-1).mean()


class DebertaV2ForSequenceClassification(_Pooled, DebertaV2Encoder):
    """logits = classify(first real token) (batch, num_labels); hf_forward reads column 0 as transformers does.
    labels= (batch,) / (batch, num_labels) -> SequenceClassifierOutput with DeBERTa's loss (sequence_loss)."""
    task = "sequence_classification"

    def __init__(self, config: DebertaV2Config):
        super().__init__(config)
        self.pooler = Linear(config.hidden_size, config.hidden_size)
        self.classifier = Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        return self._classify(input_ids, attention_mask, token_type_ids, labels, column0=False)

    def hf_forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, num_items_in_batch=None):
        """transformers' fields (logits, loss): column 0 pooled as transformers reads it, padding or not."""
        out = self._classify(input_ids, attention_mask, token_type_ids, labels, column0=True)
        return {"logits": out} if labels is None else {"loss": out.loss, "logits": out.logits}

    def _classify(self, input_ids, attention_mask, token_type_ids, labels, column0: bool):
        name = type(self).__name__
        kind = None if labels is None else check_labels(name, self.config, labels, losses.grid(input_ids)[0])
        first = self._run(input_ids, attention_mask, token_type_ids, column0=column0, first_only=True)
        logits = self.classify(first[2] if column0 else first[0])
        if labels is None:
            return logits
        if kind is None and self.config.num_labels == 1:  # (transformers returns these logits flattened)
            logits = logits.view(-1).to(labels.dtype)
        return losses.output(self.task, sequence_loss(self.config, kind, logits, labels), logits)


class DebertaV2ForMultipleChoice(MultipleChoice, _Pooled, DebertaV2Encoder):
    """input_ids (batch, choices, seq) (attention_mask, token_type_ids alike) -> logits (batch, choices): each
    choice's column 0 (as transformers reads it, padding or not) through the ContextPooler, then the dropout
    (cls_dropout, else hidden_dropout_prob) and a one-output classifier (fastenc.models.multiple_choice).
    labels= int (batch,) -> MultipleChoiceModelOutput(loss, logits). A choice with no real token is pooled as
    transformers pools it (DeBERTa's padded states)."""
    serves_empty_choices = True

    def __init__(self, config: DebertaV2Config):
        super().__init__(config)
        self.pooler = Linear(config.hidden_size, config.hidden_size)

    def choice_pool(self, ids, mask, types) -> torch.Tensor:
        return self.context(column0(self, ids, mask, types))

    @property
    def choice_dropout(self) -> float:
        cfg = self.config
        return cfg.hidden_dropout_prob if cfg.cls_dropout is None else cfg.cls_dropout


class DebertaV2ForTokenClassification(DebertaV2Encoder):
    """logits = classifier(drop(hidden)): (batch, seq, num_labels), zeros at padding; labels= as BERT's."""
    task = "token_classification"
    forward = bert.BertForTokenClassification.forward

    def __init__(self, config: DebertaV2Config):
        super().__init__(config)
        self.classifier = Linear(config.hidden_size, config.num_labels)


class DebertaV2ForQuestionAnswering(DebertaV2Encoder):
    """(start_logits, end_logits) = qa_outputs(hidden): each (batch, seq), zeros at padding. With start/end
    positions transformers' loss, its softmax over every column (the padded ones' logits from the padded state)."""
    task = "question_answering"

    def __init__(self, config: DebertaV2Config):
        losses.check_qa_labels_count(type(self).__name__, config)
        super().__init__(config)
        self.qa_outputs = Linear(config.hidden_size, 2)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None, end_positions=None):
        return bert.question_answering(self, input_ids, attention_mask, token_type_ids, start_positions,
                                       end_positions)


class DebertaV2ForMaskedLM(DebertaV2Encoder):
    """Masked-LM logits = mlm(hidden) @ word embedding^T + bias (BertForMaskedLM's forward: positions= -> (n, vocab)
    there; labels= -> MaskedLMOutput(loss, logits at the labelled tokens); neither -> (batch, seq, vocab), zeros at
    padding); hf_forward gives transformers' shapes. mlm: dense (hidden -> embedding_size), act, LayerNorm
    (legacy; legacy=False: at hidden_size, which must equal embedding_size)."""
    task = "masked_lm"
    predict = bert.BertForMaskedLM.predict
    mlm_projection = bert.BertForMaskedLM.mlm_projection
    forward = bert.BertForMaskedLM.forward
    hf_forward = bert.BertForMaskedLM.hf_forward

    def __init__(self, config: DebertaV2Config):
        if config.legacy:
            losses.check_tied(type(self).__name__, config)
        super().__init__(config)
        self.mlm = AlbertMLMHead(config)


def weight_map(cfg: DebertaV2Config, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every DeBERTa-v2 tensor (prefix "deberta." inside the head classes).
    The legacy masked-LM decoder (weight and bias) is the word embedding and cls.predictions.bias, which
    transformers' state_dict repeats as cls.predictions.decoder.*: listed once, under the stored names."""
    p = prefix
    m: list[Entry] = [("embeddings.word.weight", (f"{p}embeddings.word_embeddings.weight",), "copy")]
    if cfg.position_biased_input:
        m.append(("embeddings.position.weight", (f"{p}embeddings.position_embeddings.weight",), "copy"))
    if cfg.type_vocab_size > 0:
        m.append(("embeddings.token_type.weight", (f"{p}embeddings.token_type_embeddings.weight",), "copy"))
    if cfg.embedding_size != cfg.hidden_size:
        m += lin("embeddings.project", f"{p}embeddings.embed_proj", bias=False)
    m += lin("embeddings.norm", f"{p}embeddings.LayerNorm")
    if cfg.relative_attention:
        m.append(("rel.weight", (f"{p}encoder.rel_embeddings.weight",), "copy"))
        if cfg.rel_norm:
            m += lin("rel_norm", f"{p}encoder.LayerNorm")
    c2p, p2c = cfg.terms()
    for i in range(cfg.num_hidden_layers):
        f, h = f"layers.{i}", f"{p}encoder.layer.{i}"
        m += qkv(f"{f}.attn.Wqkv", tuple(f"{h}.attention.self.{n}_proj" for n in ("query", "key", "value")))
        if c2p and not cfg.share_att_key:
            m += lin(f"{f}.attn.pos_key", f"{h}.attention.self.pos_key_proj")
        if p2c and not cfg.share_att_key:
            m += lin(f"{f}.attn.pos_query", f"{h}.attention.self.pos_query_proj")
        m += lin(f"{f}.attn.Wo", f"{h}.attention.output.dense")
        m += lin(f"{f}.attn_norm", f"{h}.attention.output.LayerNorm")
        m += lin(f"{f}.mlp.fc1", f"{h}.intermediate.dense")
        m += lin(f"{f}.mlp.fc2", f"{h}.output.dense")
        m += lin(f"{f}.mlp_norm", f"{h}.output.LayerNorm")
    if task in ("sequence_classification", "multiple_choice"):
        m += lin("pooler", "pooler.dense") + lin("classifier", "classifier")
    elif task == "token_classification":
        m += lin("classifier", "classifier")
    elif task == "question_answering":
        m += lin("qa_outputs", "qa_outputs")
    elif task == "masked_lm" and cfg.legacy:
        m += lin("mlm.dense", "cls.predictions.transform.dense")
        m += lin("mlm.norm", "cls.predictions.transform.LayerNorm")
        m.append(("mlm.bias", ("cls.predictions.bias",), "copy"))
    elif task == "masked_lm":
        m += lin("mlm.dense", "lm_predictions.lm_head.dense") + lin("mlm.norm", "lm_predictions.lm_head.LayerNorm")
        m.append(("mlm.bias", ("lm_predictions.lm_head.bias",), "copy"))
    return m


def tiny_config(task: str = "base", hidden: int = 48, heads: int = 4, layers: int = 2, **kw):
    """A small DeBERTa-v3-shaped transformers config for tests (Architecture.tiny_config): no absolute positions,
    relative embeddings LayerNorm-ed, share_att_key, p2c and c2p, 8 log buckets up to distance 24 (so rows of ~40
    tokens reach the log buckets), no token types; question answering has 2 labels."""
    import transformers

    base = dict(vocab_size=211, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=2 * hidden + 8, max_position_embeddings=160, type_vocab_size=0,
                relative_attention=True, position_biased_input=False, pos_att_type=["p2c", "c2p"],
                norm_rel_ebd="layer_norm", share_att_key=True, position_buckets=8, max_relative_positions=24,
                num_labels=2 if task == "question_answering" else 5, attn_implementation="eager")
    base.update(kw)
    return transformers.DebertaV2Config(**base)


ARCHITECTURE = Architecture(
    model_type="deberta-v2",
    config=DebertaV2Config,
    heads=heads_of(DebertaV2Model, DebertaV2ForSequenceClassification, DebertaV2ForTokenClassification,
                   DebertaV2ForQuestionAnswering, DebertaV2ForMaskedLM, DebertaV2ForMultipleChoice),
    weight_map=weight_map,
    head_prefix="deberta.",
    lora_targets=("query_proj", "value_proj"),
    base_output="BaseModelOutput",
    tiny_config=tiny_config,
)
