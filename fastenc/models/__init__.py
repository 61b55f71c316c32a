"""Encoder models (BERT, ModernBERT, ViT) over fastenc.layers, and their Hugging Face conversion.

fastenc.from_hf(hf_model) / fastenc.from_pretrained(folder) return one of:
  BertModel, BertForSequenceClassification, BertForTokenClassification,
  ModernBertModel, ModernBertForSequenceClassification, ModernBertForTokenClassification,
  ViTModel, ViTForImageClassification
Text models: model(input_ids, attention_mask=None, token_type_ids=None) -> last hidden (batch, seq, hidden)
(task models return logits); model.encode(texts | ids) -> pooled sentence embeddings. ViT: model(pixel_values).
fastenc.accelerate(hf_model) wraps a transformers model with the same call signature and output type.
Training: the parameters require grad, model.train() turns on transformers' dropouts, the heads take labels= and
return transformers' output type with the loss (fastenc.models.losses), model.save_pretrained(folder) writes the
transformers layout (fastenc.models.saving).
"""
from fastenc.models.config import BertConfig, ModernBertConfig, ViTConfig
from fastenc.models.loading import SUPPORTED, from_hf, from_pretrained


def accelerate(hf_model, copy: bool = False):
    from fastenc.models.hf import accelerate as _accelerate
    return _accelerate(hf_model, copy=copy)


__all__ = ["BertConfig", "ModernBertConfig", "ViTConfig", "SUPPORTED", "from_hf", "from_pretrained", "accelerate"]
