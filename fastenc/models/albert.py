"""ALBERT (Lan et al. 2019) on packed tokens: BERT's word + position + token-type embeddings and their LayerNorm at
embedding_size E, projected to hidden_size H (encoder.embedding_hidden_mapping_in, always present), then BERT's
post-LayerNorm blocks (fastenc.models.bert.BertLayer: one fused QKV GEMM, the activation per config, gelu_new by
default) whose parameters are shared across layers: num_hidden_groups groups of inner_group_num blocks each, layer i
running group int(i / (num_hidden_layers / num_hidden_groups)) (transformers' AlbertTransformer), so the usual
single group runs one block num_hidden_layers times. tanh pooler on the first token; heads as transformers' Albert*.

Usage: fastenc.from_hf(hf_albert) / fastenc.from_pretrained(folder) (AlbertModel and the heads below; a saved
  AlbertForPreTraining loads as the encoder), or AlbertModel(AlbertConfig(...)).
  model(input_ids, attention_mask=None, token_type_ids=None) -> (batch, seq, hidden), zeros at padding.
Heads (transformers' names):
  AlbertForSequenceClassification  classifier(drop(tanh(pooler(first token)))) -> (batch, num_labels)
  AlbertForTokenClassification     classifier(drop(hidden)) -> (batch, seq, num_labels)
  AlbertForQuestionAnswering       qa_outputs(hidden) -> (start_logits, end_logits), each (batch, seq)
  AlbertForMaskedLM                LayerNorm_E(act(dense_HE(hidden))) @ word_embedding^T + bias -> vocab logits (the
                                   decoder is the word embedding (vocab, E) itself, as in the checkpoint)
  AlbertForMultipleChoice          classifier(drop(tanh(pooler(column 0)))) per choice -> (batch, choices)
The classifiers' dropout is classifier_dropout_prob; in the blocks transformers drops the attention output and
the attention probabilities, not the MLP output, and so does AlbertLayer.
Parameters are stored once per shared block: `layers` holds the num_hidden_groups * inner_group_num distinct blocks
(group g, block j at layers.{g * inner_group_num + j}), `blocks()` lists them in the order the forward runs them. So
the weight map (both directions), save_pretrained, LoRA adapters (one adapter per shared module, applied at every
use, as PEFT on transformers' model) and int8 quantization see each shared tensor once.
Parameter names (fastenc side of `weight_map`): BERT's embeddings.* (at E), embeddings.project.*, layers.k.*,
pooler.*, classifier.*, qa_outputs.*, mlm.{dense,norm}.*, mlm.bias.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn

from fastenc.layers import LayerNorm, Linear
from fastenc.models import bert, losses
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.config import _Common, _num_labels, _pick
from fastenc.models.convert import Entry, lin, qkv
from fastenc.models.multiple_choice import MultipleChoice


@dataclass
class AlbertConfig(_Common):
    """ALBERT: BERT's embeddings at embedding_size, projected to hidden_size, blocks shared in groups. Defaults
    are transformers' AlbertConfig's (albert-xxlarge's shape)."""
    vocab_size: int = 30000
    embedding_size: int = 128
    hidden_size: int = 4096
    num_attention_heads: int = 64
    intermediate_size: int = 16384
    num_hidden_groups: int = 1
    inner_group_num: int = 1
    hidden_act: str = "gelu_new"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    classifier_dropout_prob: float | None = 0.1
    add_pooling_layer: bool = True  # (BERT's field, read by the shared code)
    model_type: str = "albert"

    @property
    def classifier_dropout(self) -> float | None:
        """The classifiers' dropout under BERT's name (read by the shared heads; None: hidden_dropout_prob)."""
        return self.classifier_dropout_prob

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **override) -> "AlbertConfig":
        pet = d.get("position_embedding_type", "absolute")
        if pet not in (None, "absolute"):
            raise ValueError(f"AlbertConfig: position_embedding_type must be 'absolute', got {pet!r}")
        cfg = cls(**_pick(cls, d, num_labels=_num_labels(d), **override))
        cfg._check()
        for name in ("embedding_size", "num_hidden_groups", "inner_group_num"):
            v = getattr(cfg, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"AlbertConfig: {name} must be a positive int, got {v!r}")
        cfg.hf_config = dict(d)
        return cfg


def run_order(cfg: AlbertConfig) -> tuple[int, ...]:
    """Index into `layers` of every block the forward runs, in order: layer i runs group
    int(i / (num_hidden_layers / num_hidden_groups)) (transformers' float expression, verbatim), each group its
    inner_group_num blocks; groups no layer reaches are never run."""
    n, g, inner = cfg.num_hidden_layers, cfg.num_hidden_groups, cfg.inner_group_num
    return tuple(int(i / (n / g)) * inner + j for i in range(n) for j in range(inner))


class AlbertEmbeddings(bert.BertEmbeddings):
    """BERT's embeddings (and their LayerNorm and dropout) at embedding_size, then `project` (embedding_size ->
    hidden_size, transformers' encoder.embedding_hidden_mapping_in). forward(ids, positions, types): packed
    (tokens,) -> (tokens, hidden)."""

    def __init__(self, cfg: AlbertConfig):
        super().__init__(dataclasses.replace(cfg, hidden_size=cfg.embedding_size))
        self.project = Linear(cfg.embedding_size, cfg.hidden_size)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, types: torch.Tensor | None) -> torch.Tensor:
        return self.project(super().forward(ids, positions, types))


class AlbertLayer(bert.BertLayer):
    """BERT's post-norm block: LN(x + drop(attn(x))), then LN(. + mlp(.)): transformers' AlbertLayer drops the
    attention output (hidden_dropout_prob) but not the MLP output."""

    def dropouts(self) -> tuple[float, float]:
        return (self.dropout if self.training else 0.0), 0.0


class AlbertModel(bert.BertModel):
    """The encoder: BertModel's forward, _encode and _run over AlbertEmbeddings and the shared blocks (`blocks()`),
    with the tanh pooler when the checkpoint has one."""
    task = "base"

    def __init__(self, config: AlbertConfig):
        nn.Module.__init__(self)  # (BertModel's modules, with ALBERT's embeddings and shared blocks)
        self.config = config
        self.embeddings = AlbertEmbeddings(config)
        distinct = config.num_hidden_groups * config.inner_group_num
        self.layers = nn.ModuleList(AlbertLayer(config) for _ in range(distinct))
        self.order = run_order(config)
        self.pooler = Linear(config.hidden_size, config.hidden_size) if config.add_pooling_layer else None

    def blocks(self) -> list:
        """The shared blocks in the order the forward runs them (num_hidden_layers * inner_group_num of them)."""
        mods = list(self.layers._modules.values())
        return [mods[k] for k in self.order]


class AlbertForSequenceClassification(AlbertModel):
    """logits = classifier(drop(tanh(pooler(first real token)))): (batch, num_labels), dropout
    classifier_dropout_prob. labels= as BertForSequenceClassification (fastenc.models.losses)."""
    task = "sequence_classification"
    forward = bert.BertForSequenceClassification.forward
    classify = bert.BertForSequenceClassification.classify

    def __init__(self, config: AlbertConfig):
        super().__init__(dataclasses.replace(config, add_pooling_layer=True))
        self.classifier = Linear(config.hidden_size, config.num_labels)


class AlbertForTokenClassification(AlbertModel):
    """logits = classifier(drop(hidden)): (batch, seq, num_labels), zeros at padded positions, dropout
    classifier_dropout_prob (hidden_dropout_prob when None). labels= as BertForTokenClassification."""
    task = "token_classification"
    forward = bert.BertForTokenClassification.forward

    def __init__(self, config: AlbertConfig):
        super().__init__(dataclasses.replace(config, add_pooling_layer=False))
        self.classifier = Linear(config.hidden_size, config.num_labels)


class AlbertForQuestionAnswering(AlbertModel):
    """(start_logits, end_logits) = qa_outputs(hidden) split in two: each (batch, seq), zeros at padded positions.
    start_positions= / end_positions= int (batch,) -> QuestionAnsweringModelOutput with transformers' loss
    (fastenc.models.bert.question_answering: its softmax runs over the padded columns too)."""
    task = "question_answering"

    def __init__(self, config: AlbertConfig):
        losses.check_qa_labels_count(type(self).__name__, config)
        super().__init__(dataclasses.replace(config, add_pooling_layer=False))
        self.qa_outputs = Linear(config.hidden_size, 2)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None, end_positions=None):
        return bert.question_answering(self, input_ids, attention_mask, token_type_ids, start_positions,
                                       end_positions)


class AlbertMLMHead(bert.BertMLMHead):
    """transformers' AlbertMLMHead: LayerNorm(act(dense(x))) at embedding_size, @ decoder_weight^T + bias, the
    decoder weight being the word embedding (vocab, embedding_size), passed in. forward: x (n, hidden) -> (n, vocab)."""

    def __init__(self, cfg: AlbertConfig):
        nn.Module.__init__(self)
        self.act = cfg.hidden_act
        self.dense = Linear(cfg.hidden_size, cfg.embedding_size)
        self.norm = LayerNorm(cfg.embedding_size, cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))


class AlbertForMaskedLM(AlbertModel):
    """Masked-LM logits = mlm(hidden), the decoder tied to embeddings.word, computed only where needed
    (BertForMaskedLM's forward: positions= -> (n, vocab) there; labels= -> MaskedLMOutput(loss, logits at the
    labelled tokens); neither -> (batch, seq, vocab), zeros at padding). hf_forward gives transformers' shapes."""
    task = "masked_lm"
    predict = bert.BertForMaskedLM.predict
    forward = bert.BertForMaskedLM.forward
    hf_forward = bert.BertForMaskedLM.hf_forward

    def __init__(self, config: AlbertConfig):
        losses.check_tied(type(self).__name__, config)
        super().__init__(dataclasses.replace(config, add_pooling_layer=False))
        self.mlm = AlbertMLMHead(self.config)


class AlbertForMultipleChoice(MultipleChoice, AlbertModel):
    """input_ids (batch, choices, seq) (attention_mask, token_type_ids alike) -> logits (batch, choices):
    classifier(drop(tanh(pooler(column 0)))) per choice, column 0 read as transformers does (padding or not),
    dropout classifier_dropout_prob. labels= int (batch,) -> MultipleChoiceModelOutput(loss, logits)."""
    needs_pooler = True
    choice_dropout = bert.BertForMultipleChoice.choice_dropout


def weight_map(cfg: AlbertConfig, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every ALBERT tensor (prefix "albert." inside the head classes); each
    shared block once. The masked-LM decoder (weight and bias) is the word embedding and predictions.bias, which
    transformers' state_dict repeats as predictions.decoder.*: listed once, under the names the checkpoint stores."""
    p = prefix
    m: list[Entry] = [
        ("embeddings.word.weight", (f"{p}embeddings.word_embeddings.weight",), "copy"),
        ("embeddings.position.weight", (f"{p}embeddings.position_embeddings.weight",), "copy"),
        ("embeddings.token_type.weight", (f"{p}embeddings.token_type_embeddings.weight",), "copy"),
        *lin("embeddings.norm", f"{p}embeddings.LayerNorm"),
        *lin("embeddings.project", f"{p}encoder.embedding_hidden_mapping_in"),
    ]
    for g in range(cfg.num_hidden_groups):
        for j in range(cfg.inner_group_num):
            f, h = f"layers.{g * cfg.inner_group_num + j}", f"{p}encoder.albert_layer_groups.{g}.albert_layers.{j}"
            m += qkv(f"{f}.attn.Wqkv", tuple(f"{h}.attention.{n}" for n in ("query", "key", "value")))
            m += lin(f"{f}.attn.Wo", f"{h}.attention.dense")
            m += lin(f"{f}.attn_norm", f"{h}.attention.LayerNorm")
            m += lin(f"{f}.mlp.fc1", f"{h}.ffn")
            m += lin(f"{f}.mlp.fc2", f"{h}.ffn_output")
            m += lin(f"{f}.mlp_norm", f"{h}.full_layer_layer_norm")
    if cfg.add_pooling_layer:
        m += lin("pooler", f"{p}pooler")
    if task in ("sequence_classification", "token_classification", "multiple_choice"):
        m += lin("classifier", "classifier")
    elif task == "question_answering":
        m += lin("qa_outputs", "qa_outputs")
    elif task == "masked_lm":
        m += lin("mlm.dense", "predictions.dense") + lin("mlm.norm", "predictions.LayerNorm")
        m.append(("mlm.bias", ("predictions.bias",), "copy"))
    return m


def tiny_config(task: str = "base", hidden: int = 64, heads: int = 4, layers: int = 3, embedding: int = 40,
                groups: int = 1, inner: int = 1, **kw):
    """A small transformers AlbertConfig for tests (Architecture.tiny_config): embedding_size 40 != hidden_size, one
    shared block run `layers` times (groups / inner: num_hidden_groups / inner_group_num), gelu_new; question
    answering has 2 labels."""
    import transformers

    kw.setdefault("num_labels", 2 if task == "question_answering" else 5)
    return transformers.AlbertConfig(vocab_size=211, embedding_size=embedding, hidden_size=hidden,
                                     num_hidden_layers=layers, num_attention_heads=heads,
                                     intermediate_size=2 * hidden + 8, num_hidden_groups=groups,
                                     inner_group_num=inner, max_position_embeddings=160, type_vocab_size=2,
                                     attn_implementation="eager", **kw)


ARCHITECTURE = Architecture(
    model_type="albert",
    config=AlbertConfig,
    heads=heads_of(AlbertModel, AlbertForSequenceClassification, AlbertForTokenClassification,
                   AlbertForQuestionAnswering, AlbertForMaskedLM, AlbertForMultipleChoice),
    weight_map=weight_map,
    head_prefix="albert.",
    encoder_of=("AlbertForPreTraining",),
    config_overrides=bert.pooler_override,
    lora_targets=("query", "value"),
    base_output="BaseModelOutputWithPooling",
    tiny_config=tiny_config,
)
