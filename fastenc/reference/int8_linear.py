"""int8 linear layer in plain PyTorch: per-output-channel symmetric int8 weights, activations quantized per row at
run time (u8 codes with a scale and a zero point), the exact integer product, and the fp32 dequantizing epilogue —
the oracle of csrc/cpu/int8_linear*.cpp, bit for bit on the codes and the integer sums.

Math: w[j][k] ~ sw[j] wq[j][k] (wq in [-127, 127], sw = max_k |w[j][k]| / 127); x[i][k] ~ sx[i] (q[i][k] - zx[i])
(q in [1, 255]); y[i][j] = sx[i] sw[j] (sum_k q[i][k] wq[j][k] - zx[i] colsum[j]) + bias[j], colsum[j] = sum_k wq[j][k].
The packed weight (`pack_int8_ref`, the layout of csrc/cpu/int8_linear.h) is one uint8 tensor: the panels
(npad / 32, kpad / 4, 32, 4), then colsum (npad,) int32, then sw (npad,) fp32 as bytes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

PANEL, KBLOCK, ROWBLOCK, MAX_K = 32, 64, 32, 65536


def kpad(k: int) -> int:
    return -(-k // KBLOCK) * KBLOCK


def npad(n: int) -> int:
    return -(-n // PANEL) * PANEL


def packed_bytes(n: int, k: int) -> int:
    """Bytes of the packed weight of an (n, k) weight."""
    return npad(n) * kpad(k) + npad(n) * 8


def quantize_weight_ref(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (n, k) float -> (wq (n, k) int8 in [-127, 127], scale (n,) fp32): symmetric per output channel,
    wq = round(w / scale) (ties to even), scale = max|w[j]| / 127 (1 for an all-zero row)."""
    w = w.detach().float()
    amax = w.abs().amax(1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    wq = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return wq, scale


def pack_int8_ref(wq: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """wq (n, k) int8, scale (n,) fp32 -> the packed bytes (uint8, (packed_bytes(n, k),)) of the module docstring."""
    n, k = wq.shape
    np_, kp = npad(n), kpad(k)
    w = F.pad(wq.to(torch.int32), (0, kp - k, 0, np_ - n)).to(torch.int8)
    panels = w.view(np_ // PANEL, PANEL, kp // 4, 4).permute(0, 2, 1, 3).contiguous()
    colsum = F.pad(wq.to(torch.int32).sum(1, dtype=torch.int32), (0, np_ - n))
    sc = F.pad(scale.float(), (0, np_ - n))
    return torch.cat([panels.view(torch.uint8).flatten(), colsum.view(torch.uint8), sc.view(torch.uint8)])


def unpack_int8_ref(packed: torch.Tensor, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The packed bytes -> (wq (n, k) int8, scale (n,) fp32, colsum (n,) int32)."""
    np_, kp = npad(n), kpad(k)
    if packed.dtype != torch.uint8 or packed.dim() != 1 or packed.numel() != packed_bytes(n, k):
        raise ValueError(f"int8_linear: packed must be uint8 ({packed_bytes(n, k)},) for n={n}, k={k}, got "
                         f"{packed.dtype} {tuple(packed.shape)}")
    body = np_ * kp
    w = packed[:body].view(torch.int8).view(np_ // PANEL, kp // 4, PANEL, 4).permute(0, 2, 1, 3).reshape(np_, kp)
    colsum = packed[body:body + np_ * 4].clone().view(torch.int32)
    scale = packed[body + np_ * 4:].clone().view(torch.float32)
    return w[:n, :k], scale[:n], colsum[:n]


def quantize_rows_ref(x: torch.Tensor, asym: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (m, k) fp32 -> (q (m, k) uint8 codes in [1, 255], scale (m,) fp32, zero (m,) int32), x ~ scale (q - zero).
    Symmetric: scale = max|x| / 127, zero 128. asym: [min(x, 0), max(x, 0)] onto 254 steps, zero = 128 - 127 -
    round(min / scale). A row of zeros gets scale 1; a row holding NaN or an infinity gets scale NaN (its outputs NaN).
    Codes: clamp(round(x * (1 / scale)) + zero - 128, -127, 127) + 128, rounding ties to even."""
    x = x.float()
    mn = x.amin(1).clamp(max=0) if x.shape[1] else x.new_zeros(x.shape[0])
    mx = x.amax(1).clamp(min=0) if x.shape[1] else x.new_zeros(x.shape[0])
    s = (mx - mn) / 254 if asym else torch.maximum(mx, -mn) / 127
    s = torch.where(s > 0, s, torch.ones_like(s))
    inv = 1 / s
    z = (-127 - torch.round(mn * inv)).to(torch.int32) if asym else torch.zeros_like(s, dtype=torch.int32)
    c = (torch.round(x * inv[:, None]).to(torch.int32) + z[:, None]).clamp_(-127, 127)
    bad = ~torch.isfinite(x).all(1)
    s = torch.where(bad, torch.full_like(s, float("nan")), s)
    return (c + 128).to(torch.uint8), s, z + 128


def int8_matmul_ref(q: torch.Tensor, wq: torch.Tensor) -> torch.Tensor:
    """sum_k q[i][k] wq[j][k]: q (m, k) uint8, wq (n, k) int8 -> (m, n) int32, exact (fp64 sums of integers below
    2^53)."""
    return (q.double() @ wq.double().t()).to(torch.int32)


def int8_epilogue_ref(acc: torch.Tensor, xscale: torch.Tensor, xzero: torch.Tensor, wscale: torch.Tensor,
                      colsum: torch.Tensor, bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
                      gelu: str | None = None) -> torch.Tensor:
    """The fp32 epilogue: (acc - zx colsum) * (sx sw) + bias (+ residual), then GELU ("none" exact, "tanh")."""
    v = (acc - xzero[:, None] * colsum[None, :]).float() * (xscale[:, None] * wscale[None, :])
    if bias is not None:
        v = v + bias.float()
    if residual is not None:
        v = v + residual.float()
    if gelu is not None:
        v = F.gelu(v, approximate=gelu)
    return v


def int8_linear_ref(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None = None,
                    residual: torch.Tensor | None = None, gelu: str | None = None, asym: bool = True) -> torch.Tensor:
    """x (m, k) float -> (m, n) fp32: x quantized per row (quantize_rows_ref), times the packed int8 weight's
    transpose, dequantized, + bias (+ residual (m, n)), then GELU when gelu is "none" (exact) or "tanh"."""
    k = x.shape[-1]
    wq, sw, colsum = unpack_int8_ref(packed, n, k)
    q, sx, zx = quantize_rows_ref(x.reshape(-1, k), asym)
    acc = int8_matmul_ref(q, wq)
    return int8_epilogue_ref(acc, sx, zx, sw, colsum, bias, residual, gelu)
