"""CLIP (Radford et al. 2021) as one two-tower model, transformers' CLIPModel: the text tower
(fastenc.models.clip_text) and the vision tower (fastenc.models.clip_vision), each pooled (the EOS token's final
state; post_layernorm([CLS])) and projected into one space (text_projection, visual_projection, no bias); the
similarity logits are the cosines of the L2-normalized embeddings times logit_scale.exp(), and the loss
(return_loss=True) is the symmetric contrastive cross-entropy over the matching pairs of the batch.

Usage: model(input_ids (n_text, seq), pixel_values (n_image, C, H, W), attention_mask=None, return_loss=False) ->
ContrastiveOutput(loss, logits_per_image (n_image, n_text), logits_per_text (n_text, n_image), text_embeds,
image_embeds (normalized, (n, projection_dim)), text_model_output, vision_model_output);
model.get_text_features(ids, mask) / model.get_image_features(pixel_values) -> Features(last_hidden_state,
pooler_output = the projected embedding, not normalized), as transformers 5's get_*_features;
model.encode(texts) / model.encode(images=pixel_values) -> those projected embeddings (fp32, normalize= optional),
as sentence-transformers' CLIP module gives them. The towers are the tower files' modules (text_model,
vision_model); parameter names: text_model.*, vision_model.* (the towers'), text_projection, visual_projection,
logit_scale, under the same names in transformers (the towers' names inside them); PEFT LoRA adapters of the
transformers model load onto both towers (load_lora, merged or not). The shared two-tower machinery
here (the config, forward, features, encode) also serves SigLIP (fastenc.models.siglip).

CLIPForImageClassification: the vision tower, its last hidden state (before post_layernorm) averaged over the
patch tokens ([CLS] left out), a linear classifier (num_labels); model(pixel_values, labels=None) -> logits (batch,
num_labels), or transformers' ImageClassifierOutput(loss, logits) with labels. Parameter names: vision_model.*,
classifier.* (the same in transformers). SigLIP's image classifier is the same class over its own tower.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from fastenc.layers import Linear
from fastenc.lora import LoraMixin
from fastenc.models import clip_text, clip_vision, losses
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.base import TextEncoderMixin, finish_embeddings
from fastenc.models.config import _num_labels
from fastenc.models.convert import Entry, lin
from fastenc.models.saving import SaveMixin
from fastenc.quant.model import QuantMixin


class Features(NamedTuple):
    """One tower's output: last_hidden_state (batch, seq, hidden) and pooler_output (batch, dim), the tower's
    embedding (transformers 5's get_text_features / get_image_features fields)."""
    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor


class ContrastiveOutput(NamedTuple):
    """transformers' CLIPOutput / SiglipOutput fields: loss (None unless return_loss), logits_per_image
    (n_image, n_text), logits_per_text (n_text, n_image), text_embeds / image_embeds (L2-normalized), and each
    tower's Features."""
    loss: torch.Tensor | None
    logits_per_image: torch.Tensor
    logits_per_text: torch.Tensor
    text_embeds: torch.Tensor
    image_embeds: torch.Tensor
    text_model_output: Features
    vision_model_output: Features


def _tower(cls, d, name: str, owner: str):
    if d is not None and not isinstance(d, Mapping):
        raise ValueError(f"{owner}: {name} must be a config dict, got {type(d).__name__}")
    return cls.from_dict(dict(d or {}))


@dataclass
class CLIPConfig:
    """A two-tower config (transformers' CLIPConfig): text_config and vision_config (the towers' fastenc configs),
    projection_dim, logit_scale_init_value; labels as the image-classification heads read them."""
    text_config: Any = None
    vision_config: Any = None
    projection_dim: int = 512
    logit_scale_init_value: float = 2.6592
    num_labels: int = 2
    id2label: dict | None = None
    problem_type: str | None = None
    hf_config: dict | None = field(default=None, repr=False, compare=False)
    model_type: str = "clip"
    TOWERS = (clip_text.CLIPTextConfig, clip_vision.CLIPVisionConfig)
    FASTENC_ONLY = ("text_config", "vision_config")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **override):
        name = cls.__name__
        text = _tower(cls.TOWERS[0], d.get("text_config"), "text_config", name)
        vision = _tower(cls.TOWERS[1], d.get("vision_config"), "vision_config", name)
        names = {f.name for f in dataclasses.fields(cls)} - {"text_config", "vision_config", "hf_config"}
        vals = {k: v for k, v in d.items() if k in names and v is not None}
        vals["num_labels"] = _num_labels(d)
        vals.update(override)
        cfg = cls(text_config=text, vision_config=vision, **vals)
        cfg.hf_config = dict(d)
        return cfg

    # The vision tower's patch geometry (the weight map's "patch" entries read it from the config they are given).
    @property
    def num_channels(self) -> int:
        return self.vision_config.num_channels

    @property
    def patch_size(self) -> int:
        return self.vision_config.patch_size

    def hf_fields(self) -> dict:
        """config.json's text_config and vision_config: each tower's config as its own save_pretrained writes it."""
        from fastenc.models.saving import hf_config_dict

        out = {}
        for name in ("text_config", "vision_config"):
            sub = getattr(self, name)
            d = hf_config_dict(sub, sub.model_type, "base", torch.float32)
            for k in ("architectures", "dtype"):
                d.pop(k, None)
            out[name] = d
        return out


class CLIPModel(QuantMixin, LoraMixin, SaveMixin, TextEncoderMixin, nn.Module):
    """Both towers, their projections and logit_scale (see the module docstring). Subclasses (SigLIP) change the
    towers (TEXT, VISION), the projections (_project_text / _project_image), the logits and the loss."""
    task = "base"
    TEXT = clip_text.CLIPTextModel
    VISION = clip_vision.CLIPVisionModel

    def __init__(self, config: CLIPConfig):
        super().__init__()
        self.config = config
        self.text_model = self.TEXT(config.text_config)
        self.vision_model = self.VISION(config.vision_config)
        self._build_heads(config)

    def _build_heads(self, config: CLIPConfig) -> None:
        p = config.projection_dim
        self.visual_projection = Linear(config.vision_config.hidden_size, p, bias=False)
        self.text_projection = Linear(config.text_config.hidden_size, p, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(float(config.logit_scale_init_value)))

    @property
    def layers(self) -> list:
        """Every encoder block, the text tower's then the vision tower's (transformers' module order)."""
        return list(self.text_model.layers) + list(self.vision_model.layers)

    @property
    def text_config(self):
        return self.config.text_config

    @property
    def text_embedding_dim(self) -> int:
        return self.config.projection_dim

    def _project_text(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.text_projection(pooled)

    def _project_image(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.visual_projection(pooled)

    # ---- the towers ----
    def _encode(self, input_ids, attention_mask=None, token_type_ids=None):
        """The text tower on packed tokens: (x (total, hidden), PackedBatch) (TextEncoderMixin.encode runs it)."""
        return self.text_model._encode(input_ids, attention_mask, token_type_ids)

    def text_embedding(self, x: torch.Tensor, batch, input_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """The projected text embedding (get_text_features' pooler_output) from the text tower's packed states."""
        return self._project_text(self.text_model.text_embedding(x, batch, input_ids, attention_mask))

    def _vision_hidden(self, pixel_values, interpolate_pos_encoding: bool) -> torch.Tensor:
        if interpolate_pos_encoding:
            raise ValueError(f"{type(self).__name__}: interpolate_pos_encoding=True is not supported (CLIP's vision "
                             f"tower runs at the config's image_size)")
        return self.vision_model(pixel_values)

    def get_text_features(self, input_ids, attention_mask=None) -> Features:
        """Features(last_hidden_state (batch, seq, text hidden), pooler_output (batch, dim): the text embedding,
        not normalized)."""
        x, batch = self._encode(input_ids, attention_mask)
        hidden = batch.pad(x)
        return Features(hidden, self._project_text(self.text_model.pool(hidden, input_ids, attention_mask)))

    def get_image_features(self, pixel_values, interpolate_pos_encoding: bool = False) -> Features:
        """Features(last_hidden_state (batch, tokens, vision hidden), pooler_output (batch, dim): the image
        embedding, not normalized)."""
        hidden = self._vision_hidden(pixel_values, bool(interpolate_pos_encoding))
        pooled = self.vision_model.pool(hidden)
        if pooled is None:
            raise ValueError(f"{type(self).__name__}: the vision tower has no pooling head (vision_use_head=False): "
                             f"no image embedding")
        return Features(hidden, self._project_image(pooled))

    # ---- the joint forward ----
    def similarity(self, text_embeds: torch.Tensor, image_embeds: torch.Tensor) -> torch.Tensor:
        """logits_per_text (n_text, n_image) of normalized embeddings: cosine * logit_scale.exp()."""
        return text_embeds @ image_embeds.t() * self.logit_scale.exp()

    def contrastive_loss(self, logits_per_text: torch.Tensor) -> torch.Tensor:
        """CLIP's loss: the mean of the cross-entropies over texts and over images, pair i the target of row i."""
        target = torch.arange(logits_per_text.shape[0], device=logits_per_text.device)
        return (F.cross_entropy(logits_per_text, target) + F.cross_entropy(logits_per_text.t(), target)) / 2

    def forward(self, input_ids, pixel_values, attention_mask=None, return_loss: bool = False,
                interpolate_pos_encoding: bool = False) -> ContrastiveOutput:
        """input_ids (n_text, seq) int, pixel_values (n_image, C, H, W) float -> ContrastiveOutput;
        return_loss=True needs n_text == n_image (text i matches image i)."""
        if return_loss and isinstance(input_ids, torch.Tensor) and isinstance(pixel_values, torch.Tensor):
            n_text = input_ids.shape[0] if input_ids.dim() > 1 else 1
            if n_text != pixel_values.shape[0]:
                raise ValueError(f"{type(self).__name__}: return_loss=True pairs text i with image i: input_ids and "
                                 f"pixel_values must hold as many rows, got {n_text} and {pixel_values.shape[0]}")
        vision = self.get_image_features(pixel_values, interpolate_pos_encoding)
        text = self.get_text_features(input_ids, attention_mask)
        image_embeds = vision.pooler_output / vision.pooler_output.norm(p=2, dim=-1, keepdim=True)
        text_embeds = text.pooler_output / text.pooler_output.norm(p=2, dim=-1, keepdim=True)
        logits_per_text = self.similarity(text_embeds, image_embeds)
        loss = self.contrastive_loss(logits_per_text) if return_loss else None
        return ContrastiveOutput(loss, logits_per_text.t(), logits_per_text, text_embeds, image_embeds, text, vision)

    # ---- embeddings ----
    @torch.inference_mode()
    def encode(self, inputs=None, attention_mask: torch.Tensor | None = None, *, images: torch.Tensor | None = None,
               batch_size: int = 32, normalize: bool | None = None, **kw) -> torch.Tensor:
        """Embeddings in the joint space, fp32 (n, dim) on the model's device: of texts (inputs, as
        TextEncoderMixin.encode takes them, pooling='model' by default: get_text_features' pooler_output) or of
        images (images= (n, C, H, W) float pixel values, batch_size at a time: get_image_features'). normalize:
        L2-normalize (default: the folder's setting, else False)."""
        if (inputs is None) == (images is None):
            raise ValueError("encode: give texts (inputs) or images= (pixel values), exactly one of them")
        if images is None:
            return super().encode(inputs, attention_mask, batch_size=batch_size, normalize=normalize, **kw)
        if kw or attention_mask is not None:
            raise ValueError(f"encode: images= takes batch_size and normalize only, got "
                             f"{sorted(kw) + (['attention_mask'] if attention_mask is not None else [])}")
        if not isinstance(images, torch.Tensor):
            raise TypeError(f"encode: images must be a (n, channels, height, width) float tensor of pixel values, "
                            f"got {type(images).__name__}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"encode: batch_size must be a positive int, got {batch_size!r}")
        normalize = self.encode_defaults.get("normalize", False) if normalize is None else bool(normalize)
        outs = [self.get_image_features(images[a:a + batch_size]).pooler_output
                for a in range(0, images.shape[0], batch_size)]
        if not outs:
            return torch.empty(0, self.text_embedding_dim, device=next(self.parameters()).device)
        return finish_embeddings(torch.cat(outs), normalize)


class CLIPForImageClassification(QuantMixin, LoraMixin, SaveMixin, nn.Module):
    """The vision tower alone and a linear classifier (transformers' CLIPForImageClassification): logits =
    classifier(mean over the patch tokens of the tower's last hidden state, [CLS] left out, before
    post_layernorm), (batch, num_labels) (the averaged hidden state itself when num_labels is 0). labels= (batch,)
    int / float (see fastenc.models.losses) -> transformers' ImageClassifierOutput(loss, logits); transformers'
    loss here takes no num_items_in_batch (accepted and unused, as there). Subclasses (SigLIP's) change the tower
    (VISION) and the tokens averaged (_patch_tokens)."""
    task = "image_classification"
    VISION = clip_vision.CLIPVisionModel

    def __init__(self, config: CLIPConfig):
        super().__init__()
        self.config = config
        self.vision_model = self.VISION(config.vision_config)
        h = config.vision_config.hidden_size
        self.classifier = Linear(h, config.num_labels) if config.num_labels > 0 else None

    @property
    def layers(self):
        return self.vision_model.layers

    def _vision_packed(self, pixel_values, interpolate_pos_encoding: bool):
        """The tower's last hidden state, packed: (x (batch * tokens, hidden), PackedBatch)."""
        if interpolate_pos_encoding:
            raise ValueError(f"{type(self).__name__}: interpolate_pos_encoding=True is not supported (CLIP's vision "
                             f"tower runs at the config's image_size)")
        return self.vision_model(pixel_values, return_packed=True)

    def _patch_tokens(self, hidden: torch.Tensor) -> torch.Tensor:
        """(batch, tokens, hidden) -> the tokens averaged: every one after [CLS]."""
        return hidden[:, 1:]

    def forward(self, pixel_values, labels=None, num_items_in_batch=None, interpolate_pos_encoding: bool = False):
        kind = losses.check_image_labels(self, pixel_values, labels)
        x, batch = self._vision_packed(pixel_values, bool(interpolate_pos_encoding))
        pooled = self._patch_tokens(x.view(batch.batch, batch.seq, -1)).mean(dim=1)
        logits = pooled if self.classifier is None else self.classifier(pooled)
        if labels is None:
            return logits
        return losses.output(self.task, losses.sequence_loss(self.config, kind, logits, labels), logits)


def under(fe_prefix: str, entries: list[Entry]) -> list[Entry]:
    """A tower's weight-map entries with its attribute name in front of the fastenc names."""
    return [(fe_prefix + fe, hs, kind) for fe, hs, kind in entries]


def image_classifier_map(vision_map, cfg, prefix: str = "") -> list[Entry]:
    """The weight map of an image classifier over a two-tower config's vision tower: the tower's map
    (`vision_map`, its module's weight_map) under vision_model., and the classifier (when num_labels > 0)."""
    vision = under("vision_model.", vision_map(cfg.vision_config, "base", f"{prefix}vision_model."))
    return vision + (lin("classifier", f"{prefix}classifier") if cfg.num_labels > 0 else [])


def weight_map(cfg: CLIPConfig, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every tensor of CLIPModel: the towers' maps under text_model. /
    vision_model., the two projections and logit_scale; of CLIPForImageClassification: the vision tower's and the
    classifier."""
    p = prefix
    if task == "image_classification":
        return image_classifier_map(clip_vision.weight_map, cfg, p)
    m = under("text_model.", clip_text.weight_map(cfg.text_config, "base", f"{p}text_model."))
    m += under("vision_model.", clip_vision.weight_map(cfg.vision_config, "base", f"{p}vision_model."))
    m += lin("visual_projection", f"{p}visual_projection", bias=False)
    m += lin("text_projection", f"{p}text_projection", bias=False)
    m.append(("logit_scale", (f"{p}logit_scale",), "copy"))
    return m


def tiny_config(task: str = "base", hidden: int = 36, heads: int = 3, layers: int = 2, image: int = 35, patch: int = 7,
                text: dict | None = None, vision: dict | None = None, **kw):
    """A small transformers CLIPConfig for tests (Architecture.tiny_config): the towers' tiny configs, the text
    tower `hidden` wide and the vision tower hidden + 12 (towers of different widths), projection 20, 3 labels
    (CLIPForImageClassification); text= / vision= extra fields of one tower."""
    import transformers

    t = clip_text.tiny_config(hidden=hidden, heads=heads, layers=layers, **(text or {}))
    v = clip_vision.tiny_config(hidden=hidden + 12, heads=heads, layers=layers, image=image, patch=patch,
                                **(vision or {}))
    return transformers.CLIPConfig(text_config=t.to_dict(), vision_config=v.to_dict(),
                                   **{"projection_dim": 20, "num_labels": 3, "attn_implementation": "eager", **kw})


ARCHITECTURE = Architecture(
    model_type="clip",
    config=CLIPConfig,
    heads=heads_of(CLIPModel, CLIPForImageClassification),
    weight_map=weight_map,
    head_prefix="",
    modality="text+vision",
    inputs=frozenset({"input_ids", "pixel_values", "attention_mask", "return_loss", "return_dict",
                      "num_items_in_batch"}),
    token_types=False,
    hf_config=lambda cfg: cfg.hf_fields(),
    lora_targets=("q_proj", "v_proj"),
    pooling="model",
    head_outputs={"base": "transformers.models.clip.modeling_clip:CLIPOutput"},
    tiny_config=tiny_config,
)
