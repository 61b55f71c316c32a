"""Per-token positions and DeBERTa-v2/v3's disentangled attention terms (c2p, p2c): the slot function, the per-distance
slot lookup every backend reads, and the materialized relative scores of one sequence (the reference's oracle).

For query i and key j of one sequence with positions pos_i, pos_j (the index within the sequence unless the caller
gives per-token positions):
  delta = pos_i - pos_j;  with position_buckets > 0: delta = make_log_bucket_position(delta, position_buckets,
          max_relative_positions) exactly as transformers' models/deberta_v2/modeling_deberta_v2.py;
  slot(i, j) = clamp(delta + rel_span, 0, 2 * rel_span - 1)
  score(i, j) += c2p[i, h, slot(i, j)] + p2c[j, h, slot(i, j)]   (+ bias[h, pos_i - pos_j + L - 1], the distance bias)
c2p, p2c: (tokens, heads, 2 * rel_span), pre-scaled by the caller. transformers' p2c term gathers its (key, slot)
scores at clamp(-bucket(pos_j - pos_i) + rel_span) and transposes; the bucket function is odd, so that is
slot(i, j) above. The slot depends only on the distance: the lookup `slot` (2L - 1,) int32 has
slot[d + L - 1] = slot of distance d, built once per call (O(L)); only this reference materializes (seq, seq).
Gradients: dc2p[i, h, s] = sum over keys j with slot(i, j) = s of dS_ij; dp2c[j, h, s] = the same over queries i.
"""
from __future__ import annotations

import torch


def make_log_bucket_position(relative_pos: torch.Tensor, bucket_size: int, max_position: int) -> torch.Tensor:
    """DeBERTa-v2's log bucketing of relative positions (int64, any shape) -> float32 buckets: the same operations,
    in the same order and precision, as transformers' `make_log_bucket_position`."""
    sign = torch.sign(relative_pos)
    mid = bucket_size // 2
    abs_pos = torch.where((relative_pos < mid) & (relative_pos > -mid),
                          torch.tensor(mid - 1).type_as(relative_pos), torch.abs(relative_pos))
    log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, relative_pos.type_as(log_pos), log_pos * sign)


def relative_slot(delta: torch.Tensor, rel_span: int, position_buckets: int = 0,
                  max_relative_positions: int = -1) -> torch.Tensor:
    """delta = pos_i - pos_j (int64, any shape) -> the c2p / p2c slot (int64) in [0, 2 * rel_span)."""
    if position_buckets > 0:
        delta = make_log_bucket_position(delta, position_buckets, max_relative_positions).to(torch.long)
    return torch.clamp(delta + rel_span, 0, 2 * rel_span - 1)


def slot_lookup(n: int, rel_span: int, position_buckets: int = 0, max_relative_positions: int = -1,
                device=None) -> torch.Tensor:
    """The per-distance slot lookup (2n - 1,) int32: [d + n - 1] = slot of distance d = pos_i - pos_j, |d| < n."""
    n = max(int(n), 1)
    d = torch.arange(-(n - 1), n, device=device)
    return relative_slot(d, rel_span, position_buckets, max_relative_positions).to(torch.int32)


def _distance_index(s: int, n: int, positions: torch.Tensor | None, device) -> torch.Tensor:
    """(s, s) int64 index pos_i - pos_j + n - 1 into a per-distance lookup of 2n - 1 entries."""
    pos = torch.arange(s, device=device) if positions is None else positions.to(device=device, dtype=torch.long)
    if pos.numel() and (int(pos.min()) < 0 or int(pos.max()) >= n):
        raise ValueError(f"relative terms: positions must lie in [0, {n}), got values in "
                         f"[{int(pos.min())}, {int(pos.max())}]")
    return pos[:, None] - pos[None, :] + n - 1


def relative_scores(s: int, bias: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                    c2p: torch.Tensor | None = None, p2c: torch.Tensor | None = None,
                    slot: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
                    device=None) -> torch.Tensor | None:
    """The additive relative term (heads, s, s) of one sequence of s tokens, in `dtype` (None if there is none).

    bias: (heads, 2L - 1) distance lookup; positions: (s,) ints in [0, L) or None (0..s-1); c2p, p2c: (s, heads,
    slots) or None; slot: (2L - 1,) the slot lookup, given iff c2p or p2c is. Differentiable in bias, c2p and p2c."""
    lut = bias if bias is not None else slot
    if lut is None:
        return None
    n = (lut.shape[-1] + 1) // 2
    if bias is not None and slot is not None and slot.shape[-1] != bias.shape[-1]:
        raise ValueError(f"relative terms: bias and slot must cover one L, got {bias.shape[-1]} and {slot.shape[-1]}")
    if positions is None and s > n:
        raise ValueError(f"relative terms: the lookups cover sequences up to {n} tokens, got {s}")
    idx = _distance_index(s, n, positions, device if device is not None else lut.device)
    out = None
    if bias is not None:
        out = bias[:, idx].to(dtype)
    if c2p is not None or p2c is not None:
        sl = slot.to(torch.long)[idx]                                  # (s_i, s_j)
        h = (c2p if c2p is not None else p2c).shape[1]
        if c2p is not None:                                            # c2p[i, h, sl[i, j]]
            t = torch.gather(c2p.to(dtype).permute(1, 0, 2), 2, sl[None].expand(h, s, s))
            out = t if out is None else out + t
        if p2c is not None:                                            # p2c[j, h, sl[i, j]], gathered as [j, i]
            t = torch.gather(p2c.to(dtype).permute(1, 0, 2), 2, sl.t()[None].expand(h, s, s)).transpose(1, 2)
            out = t if out is None else out + t
    return out


def relative_grads(ds: torch.Tensor, bias: torch.Tensor | None, positions: torch.Tensor | None, c2p_shape,
                   p2c_shape, slot: torch.Tensor | None):
    """ds (heads, s, s), the gradient of one sequence's scores -> its (dbias (heads, 2L - 1) | None, dc2p (s, heads,
    slots) | None, dp2c | None) (c2p_shape / p2c_shape None where that term is absent)."""
    h, s, _ = ds.shape
    lut = bias if bias is not None else slot
    n = (lut.shape[-1] + 1) // 2
    idx = _distance_index(s, n, positions, ds.device)
    dbias = dc2p = dp2c = None
    if bias is not None:
        dbias = ds.new_zeros(h, 2 * n - 1).index_add_(1, idx.reshape(-1), ds.reshape(h, -1))
    if c2p_shape is not None or p2c_shape is not None:
        sl = slot.to(torch.long)[idx]
        nslots = (c2p_shape or p2c_shape)[2]
        if c2p_shape is not None:                                     # rows i, summed over j
            dc2p = ds.new_zeros(h, s, nslots).scatter_add_(2, sl[None].expand(h, s, s), ds).permute(1, 0, 2)
        if p2c_shape is not None:                                     # rows j, summed over i
            dp2c = ds.new_zeros(h, s, nslots).scatter_add_(2, sl.t()[None].expand(h, s, s),
                                                           ds.transpose(1, 2)).permute(1, 0, 2)
    return dbias, dc2p, dp2c
