"""The CLIP text tower (Radford et al. 2021), as transformers' CLIPTextModel / CLIPTextModelWithProjection: token
+ learned position embeddings, pre-norm blocks (fastenc.models.vit's, fused QKV, quick-GELU MLP) whose attention is
causal, run padding-free on packed tokens as varlen attention with window (-1, 0) (each token sees itself and the
earlier tokens of its own sequence), final_layer_norm; the pooled output is the final hidden state at the EOS token
as transformers 5 picks it: with config eos_token_id == 2 (the old configs) the column of each row's largest id,
else the first column holding eos_token_id (column 0 when none does); the projection head maps it to the joint
embedding space (text_embeds).

Usage: model(input_ids (batch, seq) int, attention_mask=None) -> last hidden state (batch, seq, hidden), zeros at
padded positions (CLIPTextModel) or text_embeds (batch, projection_dim) (CLIPTextModelWithProjection);
model.encode(texts) -> the model's text embedding (pooling='model' by default: the EOS token's state, through
text_projection in CLIPTextModelWithProjection, as sentence-transformers' CLIP module gives it);
model.hf_forward(ids, mask) -> transformers' output fields. Positions are the columns of the padded rows, as
transformers' default position_ids. A pooled column that is padding is refused (ValueError naming input_ids).
Parameter names: embeddings.{word,position}, layers.i.{attn_norm,attn.Wqkv,attn.Wo,mlp_norm,mlp.fc1,mlp.fc2}, norm,
text_projection. transformers 5 names: embeddings.{token,position}_embedding.weight,
encoder.layers.N.self_attn.{q,k,v,out}_proj, layer_norm1/2, mlp.fc1/fc2, final_layer_norm ("text_model." inside
the projection class). Training: attention_dropout on the attention probabilities (CLIP has no other dropout).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from fastenc.layers import LayerNorm, Linear
from fastenc.lora import LoraMixin
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.base import TextEncoderMixin, check_text_inputs, pack_text
from fastenc.models.clip_vision import CLIPVisionLayer
from fastenc.models.config import _Common, _pick
from fastenc.models.convert import Entry, lin, qkv
from fastenc.models.saving import SaveMixin
from fastenc.quant.model import QuantMixin


@dataclass
class CLIPTextConfig(_Common):
    """CLIP's text tower (transformers' CLIPTextConfig fields; attention_dropout read as
    attention_probs_dropout_prob)."""
    vocab_size: int = 49408
    hidden_size: int = 512
    intermediate_size: int = 2048
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    max_position_embeddings: int = 77
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    projection_dim: int = 512
    pad_token_id: int | None = 1
    bos_token_id: int | None = 49406
    eos_token_id: int | None = 49407
    attention_probs_dropout_prob: float = 0.0
    model_type: str = "clip_text_model"
    FASTENC_ONLY = ("attention_probs_dropout_prob",)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **override) -> "CLIPTextConfig":
        vals = _pick(cls, d, **override)
        vals["attention_probs_dropout_prob"] = float(d.get("attention_dropout") or 0.0)
        cfg = cls(**vals)
        cfg._check()
        cfg.hf_config = dict(d)
        return cfg

    def hf_fields(self) -> dict:
        """config.json entries under transformers' names that differ from the fastenc field names."""
        return {"attention_dropout": self.attention_probs_dropout_prob}


def eos_columns(input_ids: torch.Tensor, eos_token_id: int | None) -> torch.Tensor:
    """The pooled column of each row, as transformers 5's CLIPTextModel picks it: input_ids (batch, seq) int ->
    (batch,) int64: argmax of the ids when eos_token_id == 2 (configs before the eos fix), else the first column
    equal to eos_token_id (0 when the row has none)."""
    ids = input_ids.to(torch.int)
    if eos_token_id == 2:
        return ids.argmax(dim=-1).long()
    return (ids == eos_token_id).int().argmax(dim=-1).long()


class CLIPTextModel(QuantMixin, LoraMixin, SaveMixin, TextEncoderMixin, nn.Module):
    """The tower: embeddings, causal pre-norm blocks on packed tokens, final_layer_norm (self.norm).
    forward -> last_hidden_state; hf_forward -> {last_hidden_state, pooler_output (the EOS token's, (batch,
    hidden))}."""
    task = "base"
    pooler = None
    pools_column0 = False  # (the pooled output is the EOS token's, not column 0's: accelerate calls hf_forward)

    def __init__(self, config: CLIPTextConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.embeddings = nn.Module()
        self.embeddings.word = nn.Embedding(config.vocab_size, h)
        self.embeddings.position = nn.Embedding(config.max_position_embeddings, h)
        self.layers = nn.ModuleList(CLIPVisionLayer(config) for _ in range(config.num_hidden_layers))
        for layer in self.layers:
            layer.attn.window = (-1, 0)  # causal: itself and every earlier token of its sequence
        self.norm = LayerNorm(h, config.layer_norm_eps)

    def _check_ids(self, input_ids, attention_mask):
        cfg = self.config
        return check_text_inputs(type(self).__name__, input_ids, attention_mask, None, cfg.vocab_size,
                                 cfg.max_position_embeddings)[:2]

    def _encode(self, input_ids, attention_mask=None, token_type_ids=None):
        """(x (total, hidden) after final_layer_norm, PackedBatch) on packed tokens."""
        if token_type_ids is not None:
            raise ValueError(f"{type(self).__name__}: token_type_ids must be None (CLIP has no token-type "
                             f"embeddings), got a {type(token_type_ids).__name__}")
        input_ids, mask = self._check_ids(input_ids, attention_mask)
        batch, ids, pos = pack_text(input_ids, mask)
        w = self.embeddings.word.weight
        h = F.embedding(ids.to(w.device), w) + F.embedding(pos.to(w.device), self.embeddings.position.weight)
        delta = None
        for layer in self.layers:
            h, delta = layer(h, delta, batch)
        if delta is None:
            return self.norm(h), batch
        return self.norm(delta[0], residual=h, input_bias=delta[1], return_residual=False), batch

    def pool(self, hidden: torch.Tensor, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """The final hidden state at each row's EOS column (eos_columns): hidden (batch, seq, hidden), input_ids
        (batch, seq) -> (batch, hidden). Raises ValueError when that column is padding."""
        input_ids, mask = self._check_ids(input_ids, attention_mask)
        cols = eos_columns(input_ids, self.config.eos_token_id).to(hidden.device)
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        if mask is not None:
            bad = (~mask.to(hidden.device)[rows, cols]).nonzero().flatten().tolist()
            if bad:
                raise ValueError(f"{type(self).__name__}: the pooled (EOS) token of input_ids rows {bad[:8]} lies on "
                                 f"a padded position (attention_mask 0); give each row its EOS token "
                                 f"(eos_token_id={self.config.eos_token_id}) among its real tokens")
        return hidden[rows, cols]

    def hf_forward(self, input_ids, attention_mask=None) -> dict:
        x, batch = self._encode(input_ids, attention_mask)
        hidden = batch.pad(x)
        return {"last_hidden_state": hidden, "pooler_output": self.pool(hidden, input_ids, attention_mask)}

    def text_embedding(self, x: torch.Tensor, batch, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """The model's text embedding from the packed final states x (total, hidden) of the padded batch input_ids
        (batch, seq): pool() (the EOS token's state; encode's pooling='model') -> (batch, text_embedding_dim)."""
        return self.pool(batch.pad(x), input_ids, attention_mask)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, *, return_packed: bool = False):
        x, batch = self._encode(input_ids, attention_mask, token_type_ids)
        return (x, batch) if return_packed else batch.pad(x)


class CLIPTextModelWithProjection(CLIPTextModel):
    """text_embeds = text_projection(the EOS token's final hidden state): (batch, projection_dim). hf_forward gives
    transformers' CLIPTextModelOutput fields (text_embeds, last_hidden_state)."""
    task = "text_embedding"

    def __init__(self, config: CLIPTextConfig):
        super().__init__(config)
        self.text_projection = Linear(config.hidden_size, config.projection_dim, bias=False)

    def hf_forward(self, input_ids, attention_mask=None) -> dict:
        out = super().hf_forward(input_ids, attention_mask)
        return {"text_embeds": self.text_projection(out["pooler_output"]),
                "last_hidden_state": out["last_hidden_state"]}

    @property
    def text_embedding_dim(self) -> int:
        return self.config.projection_dim

    def text_embedding(self, x: torch.Tensor, batch, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """text_embeds: text_projection(the EOS token's state) -> (batch, projection_dim)."""
        return self.text_projection(super().text_embedding(x, batch, input_ids, attention_mask))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        if token_type_ids is not None:
            self._encode(input_ids, attention_mask, token_type_ids)  # (raises, naming the argument)
        return self.hf_forward(input_ids, attention_mask)["text_embeds"]


def weight_map(cfg: CLIPTextConfig, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every tensor of the tower (prefix: "text_model." inside
    CLIPTextModelWithProjection)."""
    p = prefix
    m: list[Entry] = [
        ("embeddings.word.weight", (f"{p}embeddings.token_embedding.weight",), "copy"),
        ("embeddings.position.weight", (f"{p}embeddings.position_embedding.weight",), "copy"),
    ]
    for i in range(cfg.num_hidden_layers):
        f, h = f"layers.{i}", f"{p}encoder.layers.{i}"
        m += lin(f"{f}.attn_norm", f"{h}.layer_norm1")
        m += qkv(f"{f}.attn.Wqkv", tuple(f"{h}.self_attn.{n}_proj" for n in "qkv"))
        m += lin(f"{f}.attn.Wo", f"{h}.self_attn.out_proj")
        m += lin(f"{f}.mlp_norm", f"{h}.layer_norm2")
        m += lin(f"{f}.mlp.fc1", f"{h}.mlp.fc1")
        m += lin(f"{f}.mlp.fc2", f"{h}.mlp.fc2")
    m += lin("norm", f"{p}final_layer_norm")
    if task == "text_embedding":
        m += lin("text_projection", "text_projection", bias=False)
    return m


def tiny_config(task: str = "base", hidden: int = 36, heads: int = 3, layers: int = 2, **kw):
    """A small transformers CLIPTextConfig for tests (Architecture.tiny_config): odd sizes, vocabulary 211 (eos 210,
    bos 209, pad 1), 40 positions."""
    import transformers

    vals = {"vocab_size": 211, "max_position_embeddings": 40, "eos_token_id": 210, "bos_token_id": 209,
            "pad_token_id": 1, "projection_dim": 20, **kw}
    return transformers.CLIPTextConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                       intermediate_size=vals.pop("intermediate", 2 * hidden - 7),
                                       attn_implementation="eager", **vals)


ARCHITECTURE = Architecture(
    model_type="clip_text_model",
    config=CLIPTextConfig,
    heads=heads_of(CLIPTextModel, CLIPTextModelWithProjection),
    weight_map=weight_map,
    head_prefix="text_model.",
    inputs=frozenset({"input_ids", "attention_mask", "return_dict", "num_items_in_batch"}),
    token_types=False,
    hf_config=lambda cfg: cfg.hf_fields(),
    lora_targets=("q_proj", "v_proj"),
    pooling="model",
    base_output="BaseModelOutputWithPooling",
    head_outputs={"text_embedding": "transformers.models.clip.modeling_clip:CLIPTextModelOutput"},
    tiny_config=tiny_config,
)
