"""Encoder models (BERT, ModernBERT, ViT) over fastenc.layers, and their Hugging Face conversion."""
