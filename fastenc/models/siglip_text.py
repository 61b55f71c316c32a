"""The SigLIP text tower (Zhai et al. 2023), as transformers' SiglipTextModel: CLIP's text tower
(fastenc.models.clip_text: token + learned position embeddings, pre-norm blocks, final_layer_norm) with
bidirectional attention (varlen, padding-free), a tanh-GELU MLP, and the pooled output head(last column's final
hidden state), the last column as transformers takes it (SigLIP was trained on max_length-padded text without a
mask, so that column is usually a pad token and a real token of the sequence).

Usage: model(input_ids (batch, seq) int, attention_mask=None) -> last hidden state (batch, seq, hidden), zeros at
padded positions; model.hf_forward(ids, mask) -> {last_hidden_state, pooler_output (batch, projection_size)}; model.encode(texts) ->
pooler_output, the texts padded with pad_token_id to max_length (default: the position table) as SigLIP's
processor pads them with padding="max_length" (pooling='model'; sentence-transformers' get_text_features). A
mask whose last column is padding is refused (ValueError naming attention_mask): transformers pools that padded
position, which fastenc's packed tokens do not compute. Parameter names: clip_text's plus head; transformers 5
names: embeddings.{token,position}_embedding.weight, encoder.layers.N.self_attn.{q,k,v,out}_proj, layer_norm1/2,
mlp.fc1/fc2, final_layer_norm, head. Training: attention_dropout on the attention probabilities only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fastenc.layers import Linear
from fastenc.models import clip_text
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.convert import Entry, lin


@dataclass
class SiglipTextConfig(clip_text.CLIPTextConfig):
    """SigLIP's text tower (transformers' SiglipTextConfig fields); projection_size (the head's width) defaults to
    hidden_size."""
    vocab_size: int = 32000
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    max_position_embeddings: int = 64
    hidden_act: str = "gelu_pytorch_tanh"
    layer_norm_eps: float = 1e-6
    projection_size: int | None = None
    model_type: str = "siglip_text_model"
    FASTENC_ONLY = ("attention_probs_dropout_prob", "projection_dim")

    def __post_init__(self):
        if self.projection_size is None:
            self.projection_size = self.hidden_size


class SiglipTextModel(clip_text.CLIPTextModel):
    """The tower with bidirectional attention; hf_forward's pooler_output = head(last_hidden_state[:, -1])."""
    task = "base"

    def __init__(self, config: SiglipTextConfig):
        super().__init__(config)
        for layer in self.layers:
            layer.attn.window = None  # bidirectional
        self.head = Linear(config.hidden_size, config.projection_size)

    def pool(self, hidden: torch.Tensor, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """head(hidden[:, -1]): hidden (batch, seq, hidden) -> (batch, projection_size). Raises ValueError when the
        last column of attention_mask is padding in some row."""
        _, mask = self._check_ids(input_ids, attention_mask)
        if mask is not None and not bool(mask[:, -1].all()):
            bad = (~mask[:, -1]).nonzero().flatten().tolist()
            raise ValueError(f"{type(self).__name__}: attention_mask rows {bad[:8]} have padding in the last column, "
                             f"which SigLIP pools; pad to max_length with the mask left out (as SigLIP was trained), "
                             f"or end each row with a real token")
        return self.head(hidden[:, -1].contiguous())


    @property
    def text_embedding_dim(self) -> int:
        return self.config.projection_size

    def _pad_tokenized(self, seqs: list[list[int]], max_length: int) -> list[list[int]]:
        """Each text's ids padded with pad_token_id to max_length, as SigLIP's processor does with
        padding="max_length" (how SigLIP was trained: no mask, the pooled last column a pad token)."""
        pad = self.config.pad_token_id
        if pad is None:
            raise ValueError(f"{type(self).__name__}: encode pads texts to max_length with config.pad_token_id, "
                             f"which is None")
        return [list(s) + [pad] * (max_length - len(s)) for s in seqs]


def weight_map(cfg: SiglipTextConfig, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every tensor of the tower (prefix: "text_model." where a class holds
    the tower)."""
    return clip_text.weight_map(cfg, "base", prefix) + lin("head", f"{prefix}head")


def tiny_config(task: str = "base", hidden: int = 36, heads: int = 3, layers: int = 2, **kw):
    """A small transformers SiglipTextConfig for tests (Architecture.tiny_config): odd sizes, vocabulary 211 (eos
    210, bos 209, pad 1), 40 positions, head width 20."""
    import transformers

    vals = {"vocab_size": 211, "max_position_embeddings": 40, "eos_token_id": 210, "bos_token_id": 209,
            "pad_token_id": 1, "projection_size": 20, **kw}
    return transformers.SiglipTextConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                         intermediate_size=vals.pop("intermediate", 2 * hidden - 7),
                                         attn_implementation="eager", **vals)


ARCHITECTURE = Architecture(
    model_type="siglip_text_model",
    config=SiglipTextConfig,
    heads=heads_of(SiglipTextModel),
    weight_map=weight_map,
    head_prefix="text_model.",
    inputs=frozenset({"input_ids", "attention_mask", "return_dict", "num_items_in_batch"}),
    token_types=False,
    hf_config=lambda cfg: cfg.hf_fields(),
    lora_targets=("q_proj", "v_proj"),
    pooling="model",
    base_output="BaseModelOutputWithPooling",
    tiny_config=tiny_config,
)
