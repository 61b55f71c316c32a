"""Small random-weight transformers models shared by the model tests (eager attention as the reference)."""
from __future__ import annotations

import torch

transformers = __import__("transformers")

BERT_CLASSES = {"base": "BertModel", "sequence_classification": "BertForSequenceClassification",
                "token_classification": "BertForTokenClassification",
                "question_answering": "BertForQuestionAnswering", "masked_lm": "BertForMaskedLM"}
MODERNBERT_CLASSES = {"base": "ModernBertModel", "sequence_classification": "ModernBertForSequenceClassification",
                      "token_classification": "ModernBertForTokenClassification",
                      "question_answering": "ModernBertForQuestionAnswering", "masked_lm": "ModernBertForMaskedLM"}
VIT_CLASSES = {"base": "ViTModel", "image_classification": "ViTForImageClassification"}


DISTILBERT_CLASSES = {"base": "DistilBertModel", "sequence_classification": "DistilBertForSequenceClassification",
                      "token_classification": "DistilBertForTokenClassification",
                      "question_answering": "DistilBertForQuestionAnswering", "masked_lm": "DistilBertForMaskedLM"}


def _init(model, seed):
    # Random non-trivial weights everywhere (LayerNorm weights/biases too), deterministic per seed.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    return model.eval()


def bert(task="base", hidden=64, heads=4, layers=2, seed=0, **kw):
    cfg = transformers.BertConfig(vocab_size=211, hidden_size=hidden, num_hidden_layers=layers,
                                  num_attention_heads=heads, intermediate_size=2 * hidden + 8,
                                  max_position_embeddings=160, type_vocab_size=2,
                                  num_labels=2 if task == "question_answering" else 5,
                                  attn_implementation="eager", **kw)
    return _init(getattr(transformers, BERT_CLASSES[task])(cfg), seed)


def modernbert(task="base", hidden=64, heads=4, layers=4, seed=0, pooling="cls", **kw):
    cfg = transformers.ModernBertConfig(vocab_size=211, hidden_size=hidden, num_hidden_layers=layers,
                                        num_attention_heads=heads, intermediate_size=hidden + 24,
                                        max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
                                        eos_token_id=2, cls_token_id=1, sep_token_id=2,
                                        num_labels=2 if task == "question_answering" else 3,
                                        classifier_pooling=pooling, attn_implementation="eager", **kw)
    return _init(getattr(transformers, MODERNBERT_CLASSES[task])(cfg), seed)


def vit(task="base", hidden=64, heads=4, layers=2, image=224, patch=16, seed=0, **kw):
    cfg = transformers.ViTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                 intermediate_size=2 * hidden, image_size=image, patch_size=patch, num_labels=4,
                                 attn_implementation="eager", **kw)
    return _init(getattr(transformers, VIT_CLASSES[task])(cfg), seed)


def text_batch(lengths, seq=None, vocab=211, seed=0):
    """Right-padded random ids and mask for the given lengths."""
    g = torch.Generator().manual_seed(seed)
    seq = seq or max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), seq), generator=g)
    mask = torch.zeros(len(lengths), seq, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    ids = ids * mask  # pad id 0 at padded positions
    types = torch.randint(0, 2, (len(lengths), seq), generator=g) * mask
    return ids, mask, types


DEIT_CLASSES = {"base": "DeiTModel", "image_classification": "DeiTForImageClassification",
                "image_classification_with_teacher": "DeiTForImageClassificationWithTeacher"}


def deit(task="base", hidden=64, heads=4, layers=2, image=32, patch=8, seed=0, **kw):
    cfg = transformers.DeiTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                  intermediate_size=2 * hidden, image_size=image, patch_size=patch,
                                  attn_implementation="eager", **{"num_labels": 4, **kw})
    return _init(getattr(transformers, DEIT_CLASSES[task])(cfg), seed)


def distilbert(task="base", hidden=64, heads=4, layers=2, seed=0, **kw):
    kw.setdefault("num_labels", 2 if task == "question_answering" else 5)
    cfg = transformers.DistilBertConfig(vocab_size=kw.pop("vocab_size", 211), dim=hidden, n_layers=layers, n_heads=heads,
                                        hidden_dim=2 * hidden + 8, max_position_embeddings=160,
                                        attn_implementation="eager", **kw)
    return _init(getattr(transformers, DISTILBERT_CLASSES[task])(cfg), seed)


ELECTRA_CLASSES = {"base": "ElectraModel", "sequence_classification": "ElectraForSequenceClassification",
                   "token_classification": "ElectraForTokenClassification",
                   "question_answering": "ElectraForQuestionAnswering"}


def electra(task="base", hidden=64, heads=4, layers=2, embedding=48, seed=0, **kw):
    # embedding_size != hidden_size: the embeddings_project layer is exercised; question answering has 2 labels.
    kw.setdefault("num_labels", 2 if task == "question_answering" else 5)
    cfg = transformers.ElectraConfig(vocab_size=211, embedding_size=embedding, hidden_size=hidden,
                                     num_hidden_layers=layers, num_attention_heads=heads,
                                     intermediate_size=2 * hidden + 8, max_position_embeddings=160,
                                     type_vocab_size=2, attn_implementation="eager", **kw)
    return _init(getattr(transformers, ELECTRA_CLASSES[task])(cfg), seed)


ROBERTA_TASKS = {"base": "Model", "sequence_classification": "ForSequenceClassification",
                 "token_classification": "ForTokenClassification", "question_answering": "ForQuestionAnswering",
                 "masked_lm": "ForMaskedLM"}


def roberta(task="base", hidden=64, heads=4, layers=2, seed=0, family="Roberta", vocab=211, **kw):
    # pad_token_id 1 (positions start at 2); a 160-row position table holds 158 tokens; one token type
    cfg = getattr(transformers, f"{family}Config")(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=2 * hidden + 8, max_position_embeddings=160, type_vocab_size=1, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, num_labels=2 if task == "question_answering" else 5,
        attn_implementation="eager", **kw)
    return _init(getattr(transformers, family + ROBERTA_TASKS[task])(cfg), seed)


def xlm_roberta(task="base", **kw):
    return roberta(task, family="XLMRoberta", **kw)


def roberta_batch(lengths, seq=None, vocab=211, seed=0):
    """Right-padded random ids (pad id 1 at padded positions, <s> = 0 first, no pad id among real tokens)."""
    ids, mask, _ = text_batch(lengths, seq, vocab, seed)
    ids = torch.where(mask.bool(), ids, torch.ones_like(ids))
    ids[:, 0] = 0
    return ids, mask


# Ops that only fastenc's encoder runs: attention (every layer but a first-token head's last one, which attends
# from its first rows in plain PyTorch) and the norms (every layer).
FASTENC_ENCODER_OPS = frozenset({"fastenc::attention", "fastenc::attention_qkv", "fastenc::layer_norm",
                                 "fastenc::rms_norm"})


def ran_fastenc(fn):
    """(fn(), whether fastenc's encoder ran during the call rather than transformers' own forward)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn()
    return out, any(e.key in FASTENC_ENCODER_OPS for e in prof.key_averages())
