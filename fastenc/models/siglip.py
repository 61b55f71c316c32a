"""SigLIP (Zhai et al. 2023, "Sigmoid Loss for Language Image Pre-Training") as one two-tower model, transformers'
SiglipModel, and SiglipForImageClassification. SiglipModel: the text tower (fastenc.models.siglip_text, its
pooled output head(last token)) and the vision tower (fastenc.models.siglip_vision, its attention-pooling head),
with no further projection; logits = cosine * logit_scale.exp() + logit_bias, and the loss (return_loss=True) is
the sigmoid loss: -sum over each text's row of logsigmoid(+-logits) (+ on the matching pair, - elsewhere), averaged
over the texts. The two-tower machinery (forward, get_*_features, encode) is CLIP's (fastenc.models.clip).
SiglipForImageClassification: the vision tower, its last hidden state averaged over the patch tokens, a linear
classifier (num_labels), labels= with transformers' loss (fastenc.models.losses): CLIP's image classifier
(fastenc.models.clip.CLIPForImageClassification) over SigLIP's tower.

Usage: as fastenc.models.clip.CLIPModel (model(input_ids, pixel_values, attention_mask=None, return_loss=False,
interpolate_pos_encoding=False) -> ContrastiveOutput; get_text_features / get_image_features -> Features;
encode(texts) (padded to max_length as SigLIP's processor pads them) / encode(images=...));
SiglipForImageClassification: model(pixel_values, labels=None, interpolate_pos_encoding=False) -> logits
(batch, num_labels), or transformers' ImageClassifierOutput(loss, logits) with labels. Parameter names:
text_model.*, vision_model.* (the towers'), logit_scale, logit_bias; classifier; the same in transformers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fastenc.models import siglip_text, siglip_vision
from fastenc.models.architecture import Architecture, heads_of
from fastenc.models.clip import CLIPConfig, CLIPForImageClassification, CLIPModel, image_classifier_map, under
from fastenc.models.convert import Entry


@dataclass
class SiglipConfig(CLIPConfig):
    """transformers' SiglipConfig: text_config and vision_config (the towers' fastenc configs); labels for
    SiglipForImageClassification. (projection_dim and logit_scale_init_value are CLIP's: not read, not written.)"""
    model_type: str = "siglip"
    TOWERS = (siglip_text.SiglipTextConfig, siglip_vision.SiglipVisionConfig)
    FASTENC_ONLY = ("text_config", "vision_config", "projection_dim", "logit_scale_init_value")


class SiglipModel(CLIPModel):
    """Both towers, logit_scale (1,) and logit_bias (1,); the towers' pooled outputs are the embeddings."""
    task = "base"
    TEXT = siglip_text.SiglipTextModel
    VISION = siglip_vision.SiglipVisionModel

    def _build_heads(self, config: SiglipConfig) -> None:
        self.logit_scale = nn.Parameter(torch.zeros(1))
        self.logit_bias = nn.Parameter(torch.zeros(1))

    @property
    def text_embedding_dim(self) -> int:
        return self.config.text_config.projection_size

    def _project_text(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled

    def _project_image(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled

    def _vision_hidden(self, pixel_values, interpolate_pos_encoding: bool) -> torch.Tensor:
        return self.vision_model(pixel_values, interpolate_pos_encoding=interpolate_pos_encoding)

    def _pad_tokenized(self, seqs: list[list[int]], max_length: int) -> list[list[int]]:
        return self.text_model._pad_tokenized(seqs, max_length)

    def similarity(self, text_embeds: torch.Tensor, image_embeds: torch.Tensor) -> torch.Tensor:
        """logits_per_text of normalized embeddings: cosine * logit_scale.exp() + logit_bias."""
        return text_embeds @ image_embeds.t() * self.logit_scale.exp() + self.logit_bias

    def contrastive_loss(self, logits_per_text: torch.Tensor) -> torch.Tensor:
        """The sigmoid loss: labels +1 on the diagonal (text i, image i), -1 elsewhere; mean over texts of
        -sum_j logsigmoid(label_ij * logit_ij)."""
        n = logits_per_text.shape[0]
        sign = 2 * torch.eye(n, device=logits_per_text.device, dtype=logits_per_text.dtype) - 1
        return -F.logsigmoid(sign * logits_per_text).sum(dim=-1).mean()


class SiglipForImageClassification(CLIPForImageClassification):
    """logits = classifier(mean over the patch tokens of the vision tower's last hidden state): (batch,
    num_labels) (the hidden state itself, averaged, when num_labels is 0). labels= (batch,) int / float (see
    fastenc.models.losses) -> transformers' ImageClassifierOutput(loss, logits); transformers' loss here takes no
    num_items_in_batch (accepted and unused, as there). CLIP's image classifier over SigLIP's tower, which has no
    [CLS] (every token is a patch) and takes interpolate_pos_encoding."""
    VISION = siglip_vision.SiglipVisionModel

    def _vision_packed(self, pixel_values, interpolate_pos_encoding: bool):
        return self.vision_model(pixel_values, interpolate_pos_encoding=interpolate_pos_encoding, return_packed=True)

    def _patch_tokens(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden


def weight_map(cfg: SiglipConfig, task: str, prefix: str = "") -> list[Entry]:
    """fastenc name <-> transformers name of every tensor: the vision tower's map under vision_model. (and the
    classifier) for SiglipForImageClassification; with the text tower's under text_model., logit_scale and
    logit_bias for SiglipModel."""
    p = prefix
    if task == "image_classification":
        return image_classifier_map(siglip_vision.weight_map, cfg, p)
    vision = under("vision_model.", siglip_vision.weight_map(cfg.vision_config, "base", f"{p}vision_model."))
    m = under("text_model.", siglip_text.weight_map(cfg.text_config, "base", f"{p}text_model.")) + vision
    return m + [("logit_scale", (f"{p}logit_scale",), "copy"), ("logit_bias", (f"{p}logit_bias",), "copy")]


def tiny_config(task: str = "base", hidden: int = 36, heads: int = 3, layers: int = 2, image: int = 35, patch: int = 7,
                text: dict | None = None, vision: dict | None = None, **kw):
    """A small transformers SiglipConfig for tests (Architecture.tiny_config): the towers' tiny configs (text
    `hidden` wide with its head's width equal to the vision tower's, hidden + 12), 3 labels; text= / vision=
    extra fields of one tower."""
    import transformers

    t = siglip_text.tiny_config(hidden=hidden, heads=heads, layers=layers,
                                **{"projection_size": hidden + 12, **(text or {})})
    v = siglip_vision.tiny_config(hidden=hidden + 12, heads=heads, layers=layers, image=image, patch=patch,
                                  **(vision or {}))
    return transformers.SiglipConfig(text_config=t.to_dict(), vision_config=v.to_dict(),
                                     **{"num_labels": 3, "attn_implementation": "eager", **kw})


ARCHITECTURE = Architecture(
    model_type="siglip",
    config=SiglipConfig,
    heads=heads_of(SiglipModel, SiglipForImageClassification),
    weight_map=weight_map,
    head_prefix="",
    modality="text+vision",
    inputs=frozenset({"input_ids", "pixel_values", "attention_mask", "return_loss", "interpolate_pos_encoding",
                      "return_dict", "num_items_in_batch"}),
    token_types=False,
    hf_config=lambda cfg: cfg.hf_fields(),
    lora_targets=("q_proj", "v_proj"),
    pooling="model",
    head_outputs={"base": "transformers.models.siglip.modeling_siglip:SiglipOutput"},
    tiny_config=tiny_config,
)
