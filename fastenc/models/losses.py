"""Losses of the classification heads, as transformers computes them, on packed tokens (no re-padding).

Sequence / image classification (config.problem_type, inferred on the first call with labels as transformers does
and then kept in the config):
  "regression"                  MSE(logits, labels)        (num_labels == 1: both squeezed)
  "single_label_classification" cross-entropy, labels int (batch,), -100 ignored
  "multi_label_classification"  BCE-with-logits, labels float (batch, num_labels)
Token classification: cross-entropy over the real tokens' logits (total_tokens, num_labels) against the labels
gathered at the same tokens, -100 ignored; a label other than -100 at a padded position (attention_mask 0) is
refused with a ValueError naming the position, as for masked-LM labels (transformers would count it in the loss
through the padded token's logits; its data collators put -100 there).
Masked LM: labels int (batch, seq), -100 ignored; the loss is cross-entropy over the labelled tokens' logits. The
logits are computed only at the rows `packed_rows` selects (the positions asked for, or the labelled ones), never
over the whole (batch, seq) grid unless asked for.
Question answering: start_positions / end_positions int (batch,), clamped to [0, seq] with seq ignored (as
transformers does); the loss is the mean of the start and end cross-entropies.
Labels are checked before any work: shape, dtype and range, with a ValueError naming `labels`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fastenc.layers import prepack

IGNORE = -100
_INT = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


def grid(input_ids) -> tuple[int, int]:
    """(batch, seq) of input_ids as the text models read them (a 1-D tensor is one sequence)."""
    shape = tuple(getattr(input_ids, "shape", ()))
    return (1, shape[0]) if len(shape) == 1 else tuple(shape[:2]) if len(shape) >= 2 else (0, 0)


def problem_type(config, labels: torch.Tensor) -> str:
    """config.problem_type, or transformers' inference from num_labels and the labels' dtype."""
    if config.problem_type is not None:
        if config.problem_type not in PROBLEM_TYPES:
            raise ValueError(f"config.problem_type must be one of {PROBLEM_TYPES} or None, got "
                             f"{config.problem_type!r}")
        return config.problem_type
    if config.num_labels == 1:
        return "regression"
    if config.num_labels > 1 and labels.dtype in (torch.long, torch.int):
        return "single_label_classification"
    return "multi_label_classification"


def _range(name: str, labels: torch.Tensor, n: int) -> None:
    """Class indices in [0, n), or IGNORE."""
    if labels.numel() == 0:
        return
    bad = (labels != IGNORE) & ((labels < 0) | (labels >= n))
    if bool(bad.any()):
        v = labels[bad].flatten()[0].item()
        raise ValueError(f"{name}: labels must be class indices in [0, {n}) or {IGNORE} (ignored), got {v}")


def check_image_labels(model, pixel_values, labels) -> str | None:
    """The problem type of an image classifier's `labels` (check_sequence_labels over pixel_values' batch), None
    without labels; labels on a model without a classifier (num_labels 0) are refused."""
    if labels is None:
        return None
    name = type(model).__name__
    if model.classifier is None:
        raise ValueError(f"{name}: labels need a classifier (num_labels > 0), this model has "
                         f"num_labels={model.config.num_labels}")
    n = int(pixel_values.shape[0]) if isinstance(pixel_values, torch.Tensor) and pixel_values.dim() else 0
    return check_sequence_labels(name, model.config, labels, n)


def check_sequence_labels(name: str, config, labels, batch: int) -> str:
    """Validate labels of a (batch,)-row classification head; returns the problem type (not yet stored)."""
    if not isinstance(labels, torch.Tensor):
        raise ValueError(f"{name}: labels must be a tensor, got {type(labels).__name__}")
    kind = problem_type(config, labels)
    n = config.num_labels
    shape = tuple(labels.shape)
    if kind == "single_label_classification":
        if labels.dtype not in _INT:
            raise ValueError(f"{name}: labels must be an integer tensor for {kind}, got {labels.dtype}")
        if labels.numel() != batch or labels.dim() > 2:
            raise ValueError(f"{name}: labels must have shape ({batch},) for {kind}, got {shape}")
        _range(name, labels, n)
        return kind
    if not labels.is_floating_point():
        raise ValueError(f"{name}: labels must be a float tensor for {kind}, got {labels.dtype}")
    if kind == "regression" and n == 1:
        if labels.numel() != batch or labels.dim() > 2:
            raise ValueError(f"{name}: labels must have shape ({batch},) or ({batch}, 1) for {kind}, got {shape}")
    elif shape != (batch, n):
        raise ValueError(f"{name}: labels must have shape ({batch}, {n}) for {kind}, got {shape}")
    return kind


def check_token_labels(name: str, config, labels, shape: tuple[int, int], attention_mask=None) -> None:
    """Validate token-classification labels: int (batch, seq), class indices or IGNORE, and IGNORE wherever
    attention_mask is 0 (a padded token has no logits of its own)."""
    if not isinstance(labels, torch.Tensor):
        raise ValueError(f"{name}: labels must be a tensor, got {type(labels).__name__}")
    if labels.dtype not in _INT:
        raise ValueError(f"{name}: labels must be an integer tensor, got {labels.dtype}")
    if tuple(labels.shape) != tuple(shape):
        raise ValueError(f"{name}: labels must have input_ids' shape {tuple(shape)}, got {tuple(labels.shape)}")
    _range(name, labels, config.num_labels)
    check_unlabelled_padding(name, labels, attention_mask)


def check_unlabelled_padding(name: str, labels: torch.Tensor, attention_mask) -> None:
    """Labels must be IGNORE wherever attention_mask (batch, seq) is 0, else a ValueError naming the first such
    position (row, column) and its label. No mask: every token is real."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.numel() != labels.numel():
        return
    pad = attention_mask.reshape(-1) == 0
    labelled = pad & (labels.reshape(-1).to(pad.device) != IGNORE)
    if bool(labelled.any()):
        seq = labels.shape[-1] if labels.dim() else 1
        f = int(labelled.nonzero()[0])
        raise ValueError(f"{name}: labels must be {IGNORE} at padded positions (attention_mask 0), got "
                         f"{int(labels.reshape(-1)[f])} at ({f // seq}, {f % seq})")


def sequence_loss(config, kind: str, logits: torch.Tensor, labels: torch.Tensor,
                  num_items_in_batch=None) -> torch.Tensor:
    """The loss of a checked sequence/image classification call; stores the problem type in config (as
    transformers does). num_items_in_batch (single-label only): sum / it instead of the mean (Trainer's
    gradient-accumulation normalization, as transformers' loss functions take it)."""
    config.problem_type = kind
    labels = labels.to(logits.device)
    if kind == "regression":
        if config.num_labels == 1:
            return F.mse_loss(logits.squeeze(), labels.to(logits.dtype).squeeze())
        return F.mse_loss(logits, labels.to(logits.dtype))
    if kind == "single_label_classification":
        return cross_entropy(logits.view(-1, config.num_labels), labels.reshape(-1), num_items_in_batch)
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))


def classify_sequence(model, input_ids, attention_mask, token_type_ids, labels):
    """The forward of a text sequence classifier that reads each row's first real token: labels checked first,
    then logits = model.classify(first token) (batch, num_labels), or transformers' output with the loss. With
    labels or under autograd the model runs its last layer past attention on the first tokens only (model._run(...,
    first_only=True)); an inference call without labels runs every token (model._encode)."""
    kind = None if labels is None else check_sequence_labels(type(model).__name__, model.config, labels,
                                                             grid(input_ids)[0])
    if labels is None and not torch.is_grad_enabled():
        x, batch = model._encode(input_ids, attention_mask, token_type_ids)
        first = batch.first_tokens(x)
    else:
        first, _, _ = model._run(input_ids, attention_mask, token_type_ids, first_only=True)
    logits = model.classify(first)
    if labels is None:
        return logits
    return output(model.task, sequence_loss(model.config, kind, logits, labels), logits)


def answer_spans(model, input_ids, start_positions, end_positions, run, project, num_items_in_batch=None):
    """The forward of a question-answering head: (start, end) logits (batch, seq), zeros at padding, or with
    start/end positions transformers' output with its loss, whose softmax runs over the padded columns too.
    run(padded) -> (x, batch, extra) is the model's `_run` (extra: the padded positions' states, computed as
    transformers does, when padded); project maps hidden states (n, hidden) to (n, 2) logits."""
    labelled = start_positions is not None or end_positions is not None
    if labelled:
        check_qa_positions(type(model).__name__, start_positions, end_positions, grid(input_ids)[0])
    x, batch, extra = run(labelled)
    logits = batch.pad(project(x))
    start, end = logits[..., 0].contiguous(), logits[..., 1].contiguous()
    if not labelled:
        return start, end
    full = logits
    if extra is not None:  # transformers' logits at the padded columns, for the loss's softmax
        rows, cols, xg = extra
        full = logits.index_put((rows, cols), project(xg).to(logits.dtype))
    loss = qa_loss(full[..., 0], full[..., 1], start_positions, end_positions, num_items_in_batch)
    return output(model.task, loss, (start, end))


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    """Mean cross-entropy over the labels that are not IGNORE (or their sum / num_items_in_batch)."""
    labels = labels.long()
    if num_items_in_batch is None:
        return F.cross_entropy(logits, labels, ignore_index=IGNORE)
    loss = F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="sum")
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def packed_rows(name: str, batch, positions) -> torch.Tensor:
    """Packed row indices (n,) int64 of the positions asked for, in row-major order.

    positions: a bool tensor (batch, seq) (True where logits are wanted) or an integer tensor (n, 2) of (row,
    column) pairs; every position must be inside (batch, seq) and a real (not padded) token, else a ValueError
    naming `positions`. `batch` is the PackedBatch of the call."""
    b, s = batch.batch, batch.seq
    if not isinstance(positions, torch.Tensor):
        raise ValueError(f"{name}: positions must be a tensor, got {type(positions).__name__}")
    device = batch.cu_seqlens.device
    positions = positions.to(device)
    if positions.dtype == torch.bool:
        if tuple(positions.shape) != (b, s):
            raise ValueError(f"{name}: positions (bool) must have input_ids' shape {(b, s)}, got "
                             f"{tuple(positions.shape)}")
        flat = positions.reshape(-1).nonzero().flatten()
    elif positions.dtype in _INT:
        if positions.dim() != 2 or positions.shape[1] != 2:
            raise ValueError(f"{name}: positions (int) must be (n, 2) (row, column) pairs, got shape "
                             f"{tuple(positions.shape)}")
        pos = positions.long()
        bad = (pos[:, 0] < 0) | (pos[:, 0] >= b) | (pos[:, 1] < 0) | (pos[:, 1] >= s)
        if bool(bad.any()):
            r, c = (int(v) for v in pos[bad][0])
            raise ValueError(f"{name}: positions must be (row, column) inside (batch, seq) = {(b, s)}, got "
                             f"({r}, {c})")
        flat = pos[:, 0] * s + pos[:, 1]
    else:
        raise ValueError(f"{name}: positions must be a bool (batch, seq) mask or an int (n, 2) tensor, got "
                         f"{positions.dtype}")
    if batch.indices is None:
        return flat
    lookup = torch.full((b * s,), -1, dtype=torch.long, device=device)
    lookup[batch.indices] = torch.arange(batch.total, device=device)
    rows = lookup[flat]
    if bool((rows < 0).any()):
        f = int(flat[rows < 0][0])
        raise ValueError(f"{name}: positions must be real tokens, got the padded position ({f // s}, {f % s})")
    return rows


def check_mlm_labels(name: str, vocab_size: int, labels, shape: tuple[int, int]) -> None:
    """Validate masked-LM labels: int (batch, seq), token ids in [0, vocab_size) or IGNORE."""
    if not isinstance(labels, torch.Tensor):
        raise ValueError(f"{name}: labels must be a tensor, got {type(labels).__name__}")
    if labels.dtype not in _INT:
        raise ValueError(f"{name}: labels must be an integer tensor, got {labels.dtype}")
    if tuple(labels.shape) != tuple(shape):
        raise ValueError(f"{name}: labels must have input_ids' shape {tuple(shape)}, got {tuple(labels.shape)}")
    _range(name, labels, vocab_size)


def check_qa_positions(name: str, start_positions, end_positions, batch: int) -> None:
    """Validate start_positions / end_positions: both given, int, batch elements each."""
    if (start_positions is None) != (end_positions is None):
        raise ValueError(f"{name}: start_positions and end_positions must be given together")
    for arg, v in (("start_positions", start_positions), ("end_positions", end_positions)):
        if not isinstance(v, torch.Tensor) or v.dtype not in _INT:
            raise ValueError(f"{name}: {arg} must be an integer tensor, got "
                             f"{getattr(v, 'dtype', type(v).__name__)}")
        if v.numel() != batch:
            raise ValueError(f"{name}: {arg} must have {batch} elements (one per sequence), got shape "
                             f"{tuple(v.shape)}")


def qa_loss(start_logits: torch.Tensor, end_logits: torch.Tensor, start_positions: torch.Tensor,
            end_positions: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    """(CE(start) + CE(end)) / 2 over (batch, seq) logits; positions outside [0, seq) are ignored (transformers
    clamps them to seq and ignores seq). num_items_in_batch: each CE a sum divided by it (transformers' loss
    function)."""
    seq = start_logits.shape[1]
    s = start_positions.reshape(-1).to(start_logits.device).long().clamp(0, seq)
    e = end_positions.reshape(-1).to(end_logits.device).long().clamp(0, seq)
    if num_items_in_batch is not None:
        s = torch.where(s == seq, IGNORE, s)
        e = torch.where(e == seq, IGNORE, e)
        return (cross_entropy(start_logits, s, num_items_in_batch) + cross_entropy(end_logits, e, num_items_in_batch)) / 2
    return (F.cross_entropy(start_logits, s, ignore_index=seq) + F.cross_entropy(end_logits, e, ignore_index=seq)) / 2


def output(task: str, loss: torch.Tensor | None, logits):
    """transformers' output type for a head (SequenceClassifierOutput, TokenClassifierOutput, MaskedLMOutput,
    QuestionAnsweringModelOutput (logits = (start, end)), ImageClassifierOutput, MultipleChoiceModelOutput);
    transformers is imported only here, when a loss is asked for."""
    try:
        from transformers import modeling_outputs as mo
    except ImportError as e:
        raise ImportError(f"labels= returns transformers' output types; install transformers ({e})") from None
    if task == "question_answering":
        return mo.QuestionAnsweringModelOutput(loss=loss, start_logits=logits[0], end_logits=logits[1])
    cls = {"sequence_classification": mo.SequenceClassifierOutput,
           "token_classification": mo.TokenClassifierOutput,
           "masked_lm": mo.MaskedLMOutput,
           "image_classification": mo.ImageClassifierOutput,
           "multiple_choice": mo.MultipleChoiceModelOutput}[task]
    return cls(loss=loss, logits=logits)


def check_tied(name: str, config) -> None:
    """Masked-LM heads tie the decoder weight to the word embedding, as transformers' checkpoints do."""
    if (config.hf_config or {}).get("tie_word_embeddings", True) is False:
        raise ValueError(f"{name}: the decoder weight must be tied to the word embedding, got a config with "
                         f"tie_word_embeddings=False")


def check_qa_labels_count(name: str, config) -> None:
    """Question answering reads two logits per token (start, end)."""
    if config.num_labels != 2:
        raise ValueError(f"{name}: question answering needs num_labels=2 (start, end logits), got "
                         f"{config.num_labels}")


def _labels_on_real_tokens(name: str, batch, labels: torch.Tensor) -> None:
    """Masked-LM labels must be IGNORE wherever attention_mask is 0 (a padded token has no prediction)."""
    if batch.indices is None:
        return
    labelled = (labels.reshape(-1) != IGNORE)
    labelled[batch.indices] = False
    if bool(labelled.any()):
        f = int(labelled.nonzero()[0])
        raise ValueError(f"{name}: labels must be {IGNORE} at padded positions (attention_mask 0), got "
                         f"{int(labels.reshape(-1)[f])} at ({f // batch.seq}, {f % batch.seq})")


def masked_lm(name: str, predict, x: torch.Tensor, batch, labels=None, positions=None, num_items_in_batch=None,
              dense: bool = False):
    """The masked-LM convention on packed hidden states x (total, hidden); predict: (n, hidden) -> (n, vocab).

    positions given -> logits there only (n, vocab), row-major (packed_rows); else labels given -> logits at the
    labelled tokens only (n_labelled, vocab) (dense=True: at every real token, (batch, seq, vocab)); neither ->
    (batch, seq, vocab), zeros at padding. With labels: MaskedLMOutput(loss, logits), the loss the mean
    cross-entropy over the labelled tokens among those (fp32), or their sum / num_items_in_batch."""
    if labels is not None:
        labels = labels.to(x.device).reshape(batch.batch, batch.seq)
        _labels_on_real_tokens(name, batch, labels)
    if positions is None and (labels is None or dense):
        packed = predict(x)
        logits = batch.pad(packed)
        if labels is None:
            return logits
        return output("masked_lm", cross_entropy(packed.float(), batch.gather(labels), num_items_in_batch), logits)
    if positions is None:
        positions = labels != IGNORE
    rows = packed_rows(name, batch, positions)
    logits = predict(x.index_select(0, rows))
    if labels is None:
        return logits
    positions = positions.to(labels.device)
    at = labels[positions] if positions.dtype == torch.bool else labels[positions[:, 0].long(), positions[:, 1].long()]
    return output("masked_lm", cross_entropy(logits.float(), at, num_items_in_batch), logits)


def decode(module, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The tied masked-LM decoder y @ weight.T (+ bias): y (n, hidden), weight (vocab, hidden) the word embedding.
    In CPU inference it runs on a packed GEMM (fastenc.layers.prepack: the panel GEMM, or oneDNN's while the extension
    is not loaded), the pack cached on `module` and rebuilt when the embedding changes; otherwise the plain GEMM."""
    path = prepack.gemm_path(y, weight)
    if path == "panels":
        cache = module.__dict__.get("_panels")
        if cache is None:
            cache = module.__dict__["_panels"] = prepack.PackCache(panels=True)
        return prepack.panel_gemm(y, cache.get(weight)[0], weight.shape[0], bias)
    if path == "onednn":
        cache = module.__dict__.get("_pack")
        if cache is None:
            cache = module.__dict__["_pack"] = prepack.PackCache()
        return prepack.linear(y, cache.get(weight)[0], bias)
    return F.linear(y, weight, bias)
