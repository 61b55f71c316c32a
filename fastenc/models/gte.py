"""GTE encoder (Alibaba's gte-v1.5 / gte-multilingual "new" architecture, transformers' GteModel) on packed tokens:
word (+ token-type, when type_vocab_size > 0) embeddings and LayerNorm, no position embedding; post-LayerNorm
blocks with one fused QKV GEMM, RoPE on q and k (theta and scaling from config.rope_parameters,
fastenc.models.rope_scaling), varlen attention; a gated MLP act(gate) * up (GELU: GeGLU, SiLU: SwiGLU through
fastenc.ops.swiglu), gate_proj and up_proj fused into one [gate | up] Wi by the weight map, down_proj with bias.

Usage: model(input_ids, attention_mask=None, token_type_ids=None) -> last hidden state (batch, seq, hidden), zeros at
padded positions; return_packed=True -> (hidden (total_tokens, hidden), PackedBatch). encode() pools the [CLS]
token by default (gte-base-en-v1.5's sentence-transformers setting). Heads: GteForSequenceClassification
(classifier(drop(tanh(pooler(first token))))), GteForTokenClassification, GteForMaskedLM (decoder tied to the word
embedding, its own bias). Positions are each token's column in the padded row, as transformers' arange.
Training: model.train() turns on transformers' dropouts (hidden_dropout_prob after the embedding norm, on the
attention and MLP outputs and on the MLP's gated activation; attention_probs_dropout_prob in the attention).
Parameter names (the fastenc side of `weight_map`): embeddings.{word,token_type}.weight, embeddings.norm.*,
layers.i.{attn.Wqkv,attn.Wo,attn_norm,mlp.Wi,mlp.Wo,mlp_norm}.*, pooler.*, classifier.*, mlm.{dense,norm}.*,
mlm.bias.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from fastenc.layers import MLP, GatedMLP, LayerNorm, Linear, SelfAttention, activation
from fastenc.layers.embedding import embedding, padding_row
from fastenc.layers.mlp import check_activation
from fastenc.lora import LoraMixin
from fastenc.quant.model import QuantMixin
from fastenc.models import losses
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.base import TextEncoderMixin, check_text_inputs, first_real, pack_text
from fastenc.models.bert import (BertForSequenceClassification, BertForTokenClassification, _add_norm,
                                  pooler_override)
from fastenc.models.columns import column_attention, padded_first_rows, padded_positions
from fastenc.models.config import _Common, _num_labels, _pick
from fastenc.models.convert import Entry, cat, lin, qkv
from fastenc.models.rope_scaling import Rope, read_rope, rope_table
from fastenc.models.saving import SaveMixin
from fastenc.padding import gather_rows


@dataclass
class GteConfig(_Common):
    """GTE: RoPE, post-LayerNorm blocks, gated MLP (config names as transformers' GteConfig)."""
    vocab_size: int = 250048
    hidden_act: str = "gelu"
    max_position_embeddings: int = 8192
    type_vocab_size: int = 1
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 1
    add_pooling_layer: bool = False
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.0
    classifier_dropout: float | None = None  # None: hidden_dropout_prob
    rope_theta: float = 160000.0
    rope_type: str = "default"
    rope_factor: float = 1.0
    model_type: str = "gte"

    FASTENC_ONLY = ("rope_theta", "rope_type", "rope_factor")  # (saved as rope_parameters, gte.hf_config)
    DEFAULT_THETA = 160000.0
    GATED = True  # a gated MLP (GELU or SiLU); Jina-v3's plain fc1 -> act -> fc2 takes any activation

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **override) -> "GteConfig":
        name = cls.__name__
        rope = read_rope(name, d, cls.DEFAULT_THETA)
        act = d.get("hidden_act", cls.hidden_act)
        check_activation(act)
        gated = ("gelu", "gelu_new", "gelu_python", "gelu_pytorch_tanh", "gelu_fast", "silu", "swish")
        if cls.GATED and act not in gated:
            raise ValueError(f"{name}: hidden_act must be a GELU or silu for the gated MLP, got {act!r}")
        cfg = cls(**_pick(cls, d, num_labels=_num_labels(d), rope_theta=rope.theta, rope_type=rope.kind,
                          rope_factor=rope.factor, **override))
        cfg._check()
        if d.get("head_dim") not in (None, cfg.head_dim):
            raise ValueError(f"{name}: head_dim must be hidden_size / num_attention_heads ({cfg.head_dim}), got "
                             f"{d.get('head_dim')!r}")
        if cfg.head_dim % 2:
            raise ValueError(f"{name}: the head dim (hidden_size / num_attention_heads = {cfg.head_dim}) must be even "
                             f"for RoPE")
        cfg.hf_config = dict(d)
        return cfg

    @property
    def rope(self) -> Rope:
        return Rope(self.rope_theta, self.rope_type, self.rope_factor)


class GteEmbeddings(nn.Module):
    def __init__(self, cfg: GteConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size) if cfg.type_vocab_size else None
        self.norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.dropout = cfg.hidden_dropout_prob
        self.pad = padding_row(cfg.pad_token_id, cfg.vocab_size)

    def forward(self, ids: torch.Tensor, types: torch.Tensor | None) -> torch.Tensor:
        """ids, types: packed (tokens,) (types None: type 0) -> (tokens, hidden)."""
        x = embedding(ids, self.word.weight, padding_idx=self.pad)
        if self.token_type is not None:
            t = self.token_type.weight[0].expand_as(x) if types is None else F.embedding(types, self.token_type.weight)
            x = self.norm(t, residual=x, return_residual=False)
        else:
            x = self.norm(x)
        return F.dropout(x, self.dropout, training=True) if self.training and self.dropout > 0 else x


class GteLayer(nn.Module):
    """Post-norm block: x = LN(x + drop(Wo(attention(rope(q, k), v)))); x = LN(x + drop(Wo(drop(act(gate) * up)))).
    gradient_checkpointing=True (fastenc.accelerate sets it from transformers' flag of the same name): in training
    under autograd the block's activations are not kept, the block is run again in the backward (checkpoint_func,
    default torch.utils.checkpoint.checkpoint(use_reentrant=False)), as transformers' GradientCheckpointingLayer."""

    gradient_checkpointing = False
    checkpoint_func = None

    def __call__(self, *args, **kwargs):
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            run = self.checkpoint_func or (lambda fn, *a: checkpoint(fn, *a, use_reentrant=False))
            return run(functools.partial(super().__call__, **kwargs), *args)
        return super().__call__(*args, **kwargs)

    def __init__(self, cfg: GteConfig, bias: bool = True, mlp_dropout: bool = True, gated: bool = True):
        """bias: the attention projections' and the MLP's down projection's biases (GTE's; NomicBERT has none);
        mlp_dropout: hidden_dropout_prob also on the MLP's gated activation (GTE's, not NomicBERT's); gated=False:
        the MLP is fc2(act(fc1(x))) with biases (Jina-v3's)."""
        super().__init__()
        h = cfg.hidden_size
        self.dropout = cfg.hidden_dropout_prob
        self.attn = SelfAttention(h, cfg.num_attention_heads, bias=bias, dropout=cfg.attention_probs_dropout_prob)
        self.attn_norm = LayerNorm(h, cfg.layer_norm_eps)
        if gated:
            self.mlp = GatedMLP(h, cfg.intermediate_size, cfg.hidden_act, bias=False, out_bias=bias,
                                dropout=cfg.hidden_dropout_prob if mlp_dropout else 0.0)
        else:
            self.mlp = MLP(h, cfg.intermediate_size, cfg.hidden_act)
        self.mlp_norm = LayerNorm(h, cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, rope,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """x: (tokens, hidden); rope: (cos, sin, positions int32 (tokens,)). rows (n,) int64: attention from those
        rows only over every token, then the rest of the block at those rows -> (n, hidden)."""
        if rows is None:
            return self.finish(self.attn.attend(x, cu_seqlens, max_seqlen, rope=rope), x)
        return self.finish(self.attn.attend_rows(x, cu_seqlens, max_seqlen, rows, rope=rope), gather_rows(x, rows))

    def finish(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The block after attention: o, the attention output at x's rows (before Wo); x, the residual."""
        p = self.dropout if self.training else 0.0
        x = _add_norm(self.attn_norm, self.attn.Wo, o, x, p)
        mlp = self.mlp
        if isinstance(mlp, GatedMLP):
            return _add_norm(self.mlp_norm, mlp.Wo, mlp.gated(x), x, p)
        return _add_norm(self.mlp_norm, mlp.fc2, mlp.hidden(x), x, p)


class GteModel(QuantMixin, LoraMixin, SaveMixin, TextEncoderMixin, nn.Module):
    task = "base"
    layer_class = GteLayer
    embeddings_class = GteEmbeddings

    def __init__(self, config: GteConfig):
        super().__init__()
        self.config = config
        self.embeddings = self.embeddings_class(config)
        self.layers = nn.ModuleList(self.layer_class(config) for _ in range(config.num_hidden_layers))
        self.pooler = Linear(config.hidden_size, config.hidden_size) if config.add_pooling_layer else None
        self._rope: dict = {}

    def _rope_table(self, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos/sin (positions, head_dim/2), grown on demand (kept out of state_dict)."""
        key = str(device)
        have = self._rope.get(key)
        if have is None or have[0].shape[0] < length:
            with torch.inference_mode(False):  # (normal tensors: a training forward may save them)
                self._rope[key] = rope_table(self.config.rope, self.config.head_dim, max(length, 512), device)
        return self._rope[key]

    def _encode(self, input_ids, attention_mask=None, token_type_ids=None):
        """Embeddings + all layers on packed tokens. Returns (x (total, hidden), PackedBatch)."""
        x, batch, _ = self._run(input_ids, attention_mask, token_type_ids)
        return x, batch

    def _run(self, input_ids, attention_mask=None, token_type_ids=None, column0: bool = False, padded: bool = False,
             first_only: bool = False):
        """(x (total, hidden), PackedBatch, first): first (batch, hidden) is the last hidden state at column 0 of
        each row when column0=True (None otherwise): the first real token's, or, where column 0 is padding, a
        padded query's as transformers computes it (it sees the row's real tokens and is no key itself).
        padded=True: first is instead (rows, cols, states (n, hidden)) of every padded position (None without
        padding). first_only=True (without column0 / padded): x is (batch, hidden), each sequence's first real
        token only, the last layer's queries and everything after them at those rows alone."""
        cfg = self.config
        input_ids, mask, types = check_text_inputs(type(self).__name__, input_ids, attention_mask, token_type_ids,
                                                   cfg.vocab_size, cfg.max_position_embeddings,
                                                   cfg.type_vocab_size or None)
        if self.embeddings.token_type is None:
            types = None  # (transformers ignores them without a token-type embedding)
        batch, ids, pos = pack_text(input_ids, mask)
        if types is not None:
            types = types.to(input_ids.device)
        cos, sin = self._rope_table(int(input_ids.shape[1]), ids.device)
        rope = (cos, sin, pos.to(torch.int32))
        x = self.embeddings(ids, None if types is None else batch.gather(types))
        cu, longest = batch.cu_seqlens, batch.max_seqlen
        if first_only and not (column0 or padded):
            if len(self.layers) == 0 or batch.total == 0:
                for layer in self.layers:
                    x = layer(x, cu, longest, rope)
                return batch.first_tokens(x), batch, None
            for layer in self.layers[:-1]:
                x = layer(x, cu, longest, rope)
            first = self.layers[-1](x, cu, longest, rope, rows=batch.first_rows())
            empty = batch.seqlens() == 0
            return (first.masked_fill(empty[:, None], 0) if bool(empty.any()) else first), batch, None
        rows, cols = padded_positions(mask) if padded else (padded_first_rows(mask) if column0 else None, None)
        xg = None
        if rows is not None:  # the padded queries (column 0 or all), run beside the packed tokens
            cols = torch.zeros_like(rows) if cols is None else cols
            xg = self.embeddings(input_ids[rows, cols], None if types is None else types[rows, cols])
        for layer in self.layers:
            if rows is not None:  # (before the layer replaces x)
                xg = layer.finish(column_attention(layer.attn, xg, rows, cols, x, cu, pos, None, (cos, sin),
                                                   seq=input_ids.shape[1] if padded else None), xg)
            x = layer(x, cu, longest, rope)
        if padded:
            return x, batch, None if rows is None else (rows, cols, xg)
        first = None
        if column0:
            first = batch.first_tokens(x)
            if rows is not None:
                first = first.index_copy(0, rows, xg.to(first.dtype))
        return x, batch, first

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """tanh(dense(first token)): hidden (batch, seq, hidden) -> (batch, hidden), the first token being each
        row's first real token (attention_mask given), else column 0."""
        if self.pooler is None:
            raise ValueError(f"{type(self).__name__}: this model has no pooler (add_pooling_layer=False)")
        return torch.tanh(self.pooler(first_real(hidden, attention_mask)))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, *, return_packed: bool = False):
        x, batch = self._encode(input_ids, attention_mask, token_type_ids)
        return (x, batch) if return_packed else batch.pad(x)

    def _apply(self, fn, *args, **kwargs):
        self._rope = {}
        return super()._apply(fn, *args, **kwargs)


class GteForSequenceClassification(GteModel):
    """logits = classifier(drop(tanh(pooler(first real token)))): (batch, num_labels). labels= (batch,) int / float
    -> transformers' SequenceClassifierOutput(loss, logits) (fastenc.models.losses)."""
    task = "sequence_classification"

    def __init__(self, config: GteConfig):
        super().__init__(dataclasses.replace(config, add_pooling_layer=True))
        self.classifier = Linear(config.hidden_size, config.num_labels)

    classify = BertForSequenceClassification.classify  # (the same head on the same config fields)
    forward = BertForSequenceClassification.forward


class GteForTokenClassification(GteModel):
    """logits = classifier(drop(hidden)): (batch, seq, num_labels), zeros at padded positions. labels= int (batch,
    seq), -100 ignored (and required at padded positions) -> TokenClassifierOutput(loss, logits)."""
    task = "token_classification"

    def __init__(self, config: GteConfig):
        super().__init__(dataclasses.replace(config, add_pooling_layer=False))
        self.classifier = Linear(config.hidden_size, config.num_labels)

    forward = BertForTokenClassification.forward


class GteLMHead(nn.Module):
    """transformers' lm_head: LayerNorm(act(dense(x))) @ decoder_weight^T + bias, act the exact GELU whatever
    hidden_act is (GTE; NomicBERT's head uses hidden_act); the decoder weight is the word embedding (passed in:
    tied, one Parameter)."""

    def __init__(self, cfg: GteConfig, act: str = "gelu"):
        super().__init__()
        self.act = act
        self.dense = Linear(cfg.hidden_size, cfg.hidden_size)
        self.norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, x: torch.Tensor, decoder_weight: torch.Tensor) -> torch.Tensor:
        """x: (n, hidden) -> (n, vocab)."""
        y = self.norm(activation(self.act, self.dense(x, with_bias=False), self.dense.output_bias()))
        return losses.decode(self, y, decoder_weight, self.bias)


class GteForMaskedLM(GteModel):
    """Masked-LM logits = mlm(hidden), decoder tied to embeddings.word (fastenc.models.losses.masked_lm):
    (batch, seq, vocab), zeros at padding; positions= -> (n, vocab) there only; labels= -> MaskedLMOutput(loss,
    logits (n_labelled, vocab)). hf_forward gives transformers' shapes (accelerate)."""
    task = "masked_lm"

    def __init__(self, config: GteConfig):
        losses.check_tied(type(self).__name__, config)
        super().__init__(dataclasses.replace(config, add_pooling_layer=False))
        self.mlm = GteLMHead(config, self.lm_act(config))

    @staticmethod
    def lm_act(config) -> str:
        """The LM head's activation: GTE's exact GELU."""
        return "gelu"

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """(n, hidden) packed hidden states -> (n, vocab) logits."""
        return self.mlm(x, self.embeddings.word.weight)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, *, positions=None):
        name = type(self).__name__
        if labels is not None:
            losses.check_mlm_labels(name, self.config.vocab_size, labels, losses.grid(input_ids))
        x, batch = self._encode(input_ids, attention_mask, token_type_ids)
        return losses.masked_lm(name, self.predict, x, batch, labels, positions)

    def hf_forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, num_items_in_batch=None):
        """transformers' MaskedLMOutput fields: logits (batch, seq, vocab) at every real token (with labels too),
        loss = mean cross-entropy over the labelled tokens."""
        name = type(self).__name__
        if labels is not None:
            losses.check_mlm_labels(name, self.config.vocab_size, labels, losses.grid(input_ids))
        x, batch = self._encode(input_ids, attention_mask, token_type_ids)
        out = losses.masked_lm(name, self.predict, x, batch, labels, dense=True)
        return {"logits": out} if labels is None else {"loss": out.loss, "logits": out.logits}


_GTE_MLM = ("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder.bias")


def weight_map(cfg: GteConfig, task: str, prefix: str = "", bias: bool = True, mlm=_GTE_MLM,
               gated: bool = True) -> list[Entry]:
    """fastenc name <-> transformers name of every GTE tensor (prefix: "gte." inside the head classes). The MLP's
    gate_proj and up_proj are fused into Wi as [gate | up] (the order fastenc.ops.geglu / swiglu read).
    bias: the attention projections and down_proj have biases; mlm: the masked-LM head's dense, norm and bias
    names (NomicBERT's map is this one with bias=False and BERT's cls.predictions names); gated=False: the MLP's
    fc1 and fc2 (Jina-v3's)."""
    p = prefix
    m: list[Entry] = [("embeddings.word.weight", (f"{p}embeddings.word_embeddings.weight",), "copy")]
    if cfg.type_vocab_size:
        m.append(("embeddings.token_type.weight", (f"{p}embeddings.token_type_embeddings.weight",), "copy"))
    m += lin("embeddings.norm", f"{p}embeddings.LayerNorm")
    for i in range(cfg.num_hidden_layers):
        f, h = f"layers.{i}", f"{p}layers.{i}"
        m += qkv(f"{f}.attn.Wqkv", tuple(f"{h}.self_attn.{n}_proj" for n in "qkv"), bias)
        m += lin(f"{f}.attn.Wo", f"{h}.self_attn.o_proj", bias)
        m += lin(f"{f}.attn_norm", f"{h}.post_attention_layernorm")
        if gated:
            m += cat(f"{f}.mlp.Wi", (f"{h}.mlp.gate_proj", f"{h}.mlp.up_proj"), bias=False)
            m += lin(f"{f}.mlp.Wo", f"{h}.mlp.down_proj", bias)
        else:
            m += lin(f"{f}.mlp.fc1", f"{h}.mlp.fc1") + lin(f"{f}.mlp.fc2", f"{h}.mlp.fc2")
        m += lin(f"{f}.mlp_norm", f"{h}.post_mlp_layernorm")
    if cfg.add_pooling_layer:
        m += lin("pooler", f"{p}pooler.dense")
    if task in ("sequence_classification", "token_classification"):
        m += lin("classifier", "classifier")
    if task == "masked_lm":  # the decoder weight is embeddings.word's (tied; the checkpoint stores it once)
        m += lin("mlm.dense", mlm[0])
        m += lin("mlm.norm", mlm[1])
        m.append(("mlm.bias", (mlm[2],), "copy"))
    return m


# The checkpoint layout transformers' save_pretrained writes for GTE (the weight layout of the original gte-v1.5 /
# gte-multilingual checkpoints; their config's model_type "new" is not read): "new." inside the head classes,
# encoder.layer.N, attention.qkv_proj ([q; k; v]), attn_ln, mlp_ln, mlp.up_gate_proj ([up | gate]: split here, then
# fused again by the map as [gate | up]), lm_head.norm.
LEGACY_NAMES = (
    (re.compile(r"^new\."), "gte."),
    (re.compile(r"(^|\.)encoder\.layer\.(\d+)\."), r"\1layers.\2."),
    (re.compile(r"\.attention\.o_proj\."), ".self_attn.o_proj."),
    (re.compile(r"\.attn_ln\."), ".post_attention_layernorm."),
    (re.compile(r"\.mlp_ln\."), ".post_mlp_layernorm."),
    (re.compile(r"^lm_head\.norm\."), "lm_head.layer_norm."),
)
LEGACY_FUSED = (
    (r"(.*layers\.\d+)\.attention\.qkv_proj\.(weight|bias)",
     ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    (r"(.*layers\.\d+)\.mlp\.up_gate_proj\.(weight|bias)", ("mlp.up_proj", "mlp.gate_proj")),
)


def hf_config(cfg: GteConfig) -> dict:
    """config.json's rope_parameters (transformers reads the theta and scaling there)."""
    return {"rope_parameters": cfg.rope.to_hf()}


def tiny_config(task: str = "base", hidden: int = 64, heads: int = 4, layers: int = 2, **kw):
    """A small transformers GteConfig for tests (Architecture.tiny_config; eager attention as the reference)."""
    import transformers

    kw.setdefault("type_vocab_size", 2)
    kw.setdefault("max_position_embeddings", 4096)
    return transformers.GteConfig(vocab_size=211, hidden_size=hidden, num_hidden_layers=layers,
                                  num_attention_heads=heads, intermediate_size=hidden + 24, pad_token_id=0,
                                  num_labels=5, attn_implementation="eager", **kw)


ARCHITECTURE = Architecture(
    model_type="gte",
    config=GteConfig,
    heads=heads_of(GteModel, GteForSequenceClassification, GteForTokenClassification, GteForMaskedLM),
    weight_map=weight_map,
    head_prefix="gte.",
    legacy_names=LEGACY_NAMES,
    legacy_fused=LEGACY_FUSED,
    config_overrides=pooler_override,
    hf_config=hf_config,
    lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"),
    pooling="cls",
    base_output="BaseModelOutputWithPooling",
    tiny_config=tiny_config,
)
