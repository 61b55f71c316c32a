"""fastenc: a fast runtime for encoder-only transformers (BERT, ModernBERT, ViT) on its own kernels."""
from fastenc import ops
from fastenc.registry import use_backend

__version__ = "0.1.0"

__all__ = ["ops", "use_backend", "__version__"]
