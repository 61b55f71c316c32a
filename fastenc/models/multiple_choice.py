"""The multiple-choice head of the text architectures, declared once (transformers' *ForMultipleChoice): every
choice of every question is one row through the encoder, pooled the architecture's own way, dropped out, scored
by one Linear(hidden, 1) named `classifier`, and the scores are viewed as (batch, choices); labels give
transformers' loss, the cross-entropy over the choices (-100 ignored).

An architecture's class mixes `MultipleChoice` in before its encoder class and declares its pooling:
  choice_pool(ids, mask, types) -> (batch * choices, hidden), the pooled output before the classifier's dropout
      (default: tanh(pooler(column 0)), the BERT / ALBERT / RoBERTa / MPNet pooler, built when needs_pooler);
  choice_dropout -> float, the dropout before the classifier (default: config.hidden_dropout_prob);
  serves_empty_choices -> whether a choice with no real token (an all-zero row of attention_mask) is pooled as
      transformers pools it (DeBERTa's padded states are). Elsewhere transformers' value there comes from its
      masked softmax falling back to uniform attention over the padding, which fastenc does not compute: the
      forward refuses such a mask (ValueError naming the choice) and accelerate runs transformers' forward for it.
Pooling helpers: `column0` (column 0's last hidden state as transformers computes it, padding or not) and
`padded_hidden` (every column's, the padded ones included; ELECTRA's 'last' and 'mean' summaries).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from fastenc.layers import Linear
from fastenc.models import losses


def flatten(name: str, input_ids, attention_mask, token_type_ids, labels):
    """Check multiple-choice inputs, each (batch, choices, seq), labels int (batch,) in [0, choices) or -100.
    Returns (batch, choices, ids, mask, types), the last three (batch * choices, seq) (None where not given)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 3:
        raise ValueError(f"{name}: input_ids must be (batch, choices, seq), got shape "
                         f"{tuple(getattr(input_ids, 'shape', ()))}")
    b, c, s = input_ids.shape
    flat = []
    for arg, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != (b, c, s)):
            raise ValueError(f"{name}: {arg} must have input_ids' shape {(b, c, s)}, got "
                             f"{tuple(getattr(t, 'shape', ()))}")
        flat.append(None if t is None else t.reshape(b * c, s))
    if labels is not None:
        if not isinstance(labels, torch.Tensor) or labels.dtype not in losses._INT or labels.numel() != b:
            raise ValueError(f"{name}: labels must be an integer tensor of shape ({b},), got "
                             f"{getattr(labels, 'dtype', type(labels).__name__)} "
                             f"{tuple(getattr(labels, 'shape', ()))}")
        losses._range(name, labels, c)
    return b, c, input_ids.reshape(b * c, s), flat[0], flat[1]


def empty_choice(mask) -> tuple[int, int] | None:
    """(batch, choice) of the first choice whose attention_mask (batch, choices, seq) row has no real token, or
    None."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 3 or mask.numel() == 0:
        return None
    empty = ~mask.bool().any(-1)
    if not bool(empty.any()):
        return None
    i, j = (int(v) for v in empty.nonzero()[0])
    return i, j


def _column0_real(mask) -> bool:
    return mask is None or (isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[1] > 0
                            and bool(mask[:, 0].bool().all()))


def column0(model, ids, mask, types) -> torch.Tensor:
    """(n, hidden): each row's last hidden state at column 0 as transformers computes it, padding or not
    (model._run(column0=True)). When column 0 is real in every row and autograd records the call, the last layer
    runs past attention on those first tokens only (first_only)."""
    if torch.is_grad_enabled() and _column0_real(mask):
        return model._run(ids, mask, types, first_only=True)[0]
    return model._run(ids, mask, types, column0=True)[2]


def padded_hidden(model, ids, mask, types) -> torch.Tensor:
    """(n, seq, hidden): the last hidden state at every column, the padded ones as transformers computes them
    (model._run(padded=True))."""
    x, batch, extra = model._run(ids, mask, types, padded=True)
    full = batch.pad(x)
    if extra is not None:
        rows, cols, states = extra
        full = full.index_put((rows, cols), states.to(full.dtype))
    return full


class MultipleChoice:
    """The multiple-choice head (see the module docstring): forward(input_ids (batch, choices, seq),
    attention_mask=None, token_type_ids=None, labels=None) -> logits (batch, choices), or with labels= int
    (batch,) transformers' MultipleChoiceModelOutput(loss, logits)."""
    task = "multiple_choice"
    needs_pooler = False  # (BERT, ALBERT, RoBERTa, MPNet: the encoder's tanh pooler is part of the head)
    serves_empty_choices = False

    def __init__(self, config):
        if self.needs_pooler:
            config = dataclasses.replace(config, add_pooling_layer=True)
        super().__init__(config)
        self.classifier = Linear(self.config.hidden_size, 1)

    def choice_pool(self, ids, mask, types) -> torch.Tensor:
        """tanh(pooler(column 0)): (n, hidden)."""
        return torch.tanh(self.pooler(column0(self, ids, mask, types)))

    @property
    def choice_dropout(self) -> float:
        return self.config.hidden_dropout_prob

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        name = type(self).__name__
        b, c, ids, mask, types = flatten(name, input_ids, attention_mask, token_type_ids, labels)
        empty = None if self.serves_empty_choices else empty_choice(attention_mask)
        if empty is not None:
            raise ValueError(f"{name}: attention_mask has a choice with no real token (batch {empty[0]}, choice "
                             f"{empty[1]}): transformers scores it from uniform attention over the padding, which "
                             f"fastenc does not compute")
        pooled = self.choice_pool(ids, mask, types)
        p = self.choice_dropout if self.training else 0.0
        logits = self.classifier(F.dropout(pooled, p, training=True) if p > 0 else pooled).view(b, c)
        if labels is None:
            return logits
        return losses.output(self.task, losses.cross_entropy(logits, labels.to(logits.device).reshape(-1)), logits)
