"""fastenc: a fast runtime for encoder-only transformers (BERT's family, ModernBERT, ViT/DeiT) on its own kernels.

  from_hf, from_pretrained, accelerate   load or wrap a model (fastenc.models; the architecture table)
  ops, use_backend                       the ops and the backend choice (fastenc.ops, fastenc.registry)
  backends / reference / kernels         backend declarations, torch references, Triton kernels; csrc/ (C++)
  layers, models, lora                   blocks, architectures and heads, PEFT LoRA (lora_files, lora_train)
  quantize, dequantize                   int8 inference on CPU (fastenc.quant)
  corpus, serve, benchmark               the corpus embedding job, the HTTP server, benchmarks (fastenc bench)
  cli, run, finetune, testing            the command line and its programs; the tolerance rule and test cases
"""
from fastenc import ops
from fastenc.registry import use_backend

__version__ = "0.1.0"



def from_hf(hf_model, copy: bool = True):
    """fastenc model equivalent to a transformers BERT/ModernBERT/ViT model (see fastenc.models)."""
    from fastenc.models.loading import from_hf as _from_hf
    return _from_hf(hf_model, copy=copy)


def from_pretrained(path, device=None, dtype=None, quantize: str | None = None):
    """fastenc model from a local Hugging Face folder, without importing transformers (see fastenc.models).
    quantize="int8": then fastenc.quantize(model, "int8") (CPU fp32 inference)."""
    from fastenc.models.loading import from_pretrained as _from_pretrained
    model = _from_pretrained(path, device=device, dtype=dtype)
    if quantize is not None:
        from fastenc.quant import quantize as _quantize
        _quantize(model.eval(), quantize)
    return model


def quantize(model, mode: str = "int8", *, keep=(), asym: bool = True):
    """Quantize a fastenc model's encoder linear layers to int8 in place (CPU fp32 inference; reversible with
    dequantize; see fastenc.quant.model). keep: layer names or patterns kept in fp32. Returns the model."""
    from fastenc.quant import quantize as _quantize
    return _quantize(model, mode, keep=keep, asym=asym)


def dequantize(model):
    """Undo quantize: the model runs on its (unchanged) fp32 weights again. Returns the model."""
    from fastenc.quant import dequantize as _dequantize
    return _dequantize(model)


def accelerate(hf_model, copy: bool = False):
    """A module with hf_model's forward signature and output type, running on fastenc (see fastenc.models.hf), for
    inference and training (labels, dropout, gradients on hf_model's own parameters: transformers.Trainer trains
    it). A call fastenc cannot serve exactly (inputs_embeds, output_attentions, ...) runs the transformers forward
    and says why with a fastenc.models.hf.FallbackWarning, once per reason.

    A sentence-transformers SentenceTransformer, CrossEncoder or SparseEncoder is accelerated in place and the same
    object returned: its transformer modules' transformers model is replaced (fastenc.models.st), so encode() and
    predict() run fastenc. Do this rather than assigning `st_model[0].auto_model = fastenc.accelerate(...)`: from
    sentence-transformers 6, auto_model is a read-only view of `.model`, and assigning to it does nothing (the
    model keeps running transformers)."""
    from fastenc.models.st import is_sentence_transformers

    if is_sentence_transformers(hf_model):
        from fastenc.models.st import accelerate as _accelerate_st
        return _accelerate_st(hf_model, copy=copy)
    from fastenc.models.hf import accelerate as _accelerate
    return _accelerate(hf_model, copy=copy)


def embed(texts_or_path, model=None, **kwargs):
    """The corpus job: embed texts or files with token-budget batches, optionally into sharded resumable output
    (see fastenc.corpus.embed for every argument)."""
    from fastenc.corpus import embed as _embed
    return _embed(texts_or_path, model, **kwargs)


def empty_cache() -> None:
    """Free the CPU buffers fastenc keeps cached for reuse between layers and calls (like torch.cuda.empty_cache);
    buffers of tensors still alive are kept until those are freed. FASTENC_CPU_CACHE=0 disables the cache."""
    from fastenc.extension import empty_cache as _empty_cache
    _empty_cache()


__all__ = ["ops", "use_backend", "from_hf", "from_pretrained", "accelerate", "embed", "quantize", "dequantize",
           "empty_cache", "__version__"]
