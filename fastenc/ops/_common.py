"""Argument checks shared by the public ops: every error names the argument, the expected and the received."""
from __future__ import annotations

from typing import Any, Optional

import torch

from fastenc.ops._library import custom_op
from fastenc.registry import FLOAT_DTYPES, _dt


def check_float(name: str, op: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} must be float32, float16 or bfloat16, got {_dt(t.dtype)}")
    return t


def check_like(name: str, op: str, t: torch.Tensor | None, ref: torch.Tensor, ref_name: str = "x",
               shape: tuple[int, ...] | None = None, same_dtype: bool = True) -> None:
    """`t` (if given) must be a float tensor on ref's device, with ref's dtype and the given shape."""
    if t is None:
        return
    check_float(name, op, t)
    if t.device != ref.device:
        raise ValueError(f"{op}: {name} must be on {ref_name}'s device {ref.device}, got {t.device}")
    if same_dtype and t.dtype != ref.dtype:
        raise TypeError(f"{op}: {name} must have {ref_name}'s dtype {_dt(ref.dtype)}, got {_dt(t.dtype)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def check_eps(op: str, eps: Any) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"{op}: eps must be a float, got {type(eps).__name__}")
    if not eps > 0:
        raise ValueError(f"{op}: eps must be > 0, got {eps}")
    return float(eps)


APPROXIMATIONS = ("none", "tanh", "quick")  # GELU forms: exact erf, tanh, quick x * sigmoid(1.702 x)


def check_approximate(op: str, approximate: Any) -> str:
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"{op}: approximate must be 'none', 'tanh' or 'quick', got {approximate!r}")
    return approximate


def needs_grad(*tensors) -> bool:
    """Whether autograd will record an op over these inputs (grad mode on and one of them requires grad)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def rows_view(x: torch.Tensor, width: int) -> torch.Tensor:
    """(..., width) -> (rows, width) contiguous (copies only if needed; x itself when already so)."""
    if x.dim() == 2 and x.is_contiguous():
        return x
    return x.reshape(-1, width).contiguous()


def as_shape(t: torch.Tensor, shape) -> torch.Tensor:
    """t viewed as `shape` (t itself when it already has it)."""
    return t if t.shape == shape else t.view(shape)


def empty_or(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Custom ops cannot return None: an absent optional output travels as an empty tensor."""
    return t if t is not None else like.new_empty(0)


def check_cu_seqlens(cu_seqlens, total: int, device, op: str = "attention", max_seqlen: int | None = None) -> list[int]:
    """Validate FlashAttention-style cu_seqlens (int32 (batch+1,), from 0, non-decreasing, to `total`); returns it
    as a Python list.

    Read on every call (a device sync on CUDA): a remembered "already checked" tensor can be changed behind the
    version counter (through numpy, `.data` or shared memory). The kernels bounds-check what they read as well,
    so a value changed after this check can give a wrong result but never touches memory outside the tensors.

    Under torch.compile the values are not known while tracing: the checks that read them run in the graph, on
    every call, inside the fastenc::cu_seqlens_lengths op (the same errors), and the list returned holds symbolic
    ints, [0, n0, n0 + n1, ...] over the sequence lengths n_i >= 0 that op returns, so the caller's max over
    the differences is the symbolic longest length.
    max_seqlen: every sequence must be at most that long (a caller's bound, checked the same way)."""
    if not torch.compiler.is_compiling():
        return _validate_cu_seqlens(cu_seqlens, total, device, op, max_seqlen)
    _check_cu_seqlens_meta(cu_seqlens, device, op)
    cu = [0]
    for n in _cu_seqlens_lengths_op(cu_seqlens, total, op, max_seqlen).tolist():
        torch._check(n >= 0)
        cu.append(cu[-1] + n)
    return cu


@custom_op("fastenc::cu_seqlens_lengths", mutates_args=())
def _cu_seqlens_lengths_op(cu_seqlens: torch.Tensor, total: int, op: str, max_seqlen: Optional[int]) -> torch.Tensor:
    """cu_seqlens (batch+1,) int32 -> the sequence lengths (batch,) int32, after _validate_cu_seqlens."""
    _validate_cu_seqlens(cu_seqlens, total, cu_seqlens.device, op, max_seqlen)
    return cu_seqlens[1:] - cu_seqlens[:-1]


@_cu_seqlens_lengths_op.register_fake
def _(cu_seqlens, total, op, max_seqlen):
    return cu_seqlens.new_empty(cu_seqlens.shape[0] - 1)


def _check_cu_seqlens_meta(cu_seqlens, device, op: str) -> None:
    """The checks of cu_seqlens that read no value: type, dtype, shape, device."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"{op}: cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype != torch.int32:
        raise ValueError(f"{op}: cu_seqlens must be int32, got {str(cu_seqlens.dtype).replace('torch.', '')}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{op}: cu_seqlens must be 1-D of length batch+1 >= 2, got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != torch.device(device):
        raise ValueError(f"{op}: cu_seqlens must be on q's device {device}, got {cu_seqlens.device}")


def _validate_cu_seqlens(cu_seqlens, total: int, device, op: str, max_seqlen: int | None = None) -> list[int]:
    _check_cu_seqlens_meta(cu_seqlens, device, op)
    cu = cu_seqlens.tolist()
    if cu[0] != 0:
        raise ValueError(f"{op}: cu_seqlens must start at 0, got {cu[0]}")
    if any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"{op}: cu_seqlens must be non-decreasing, got {cu}")
    if cu[-1] != total:
        raise ValueError(f"{op}: cu_seqlens must end at total_tokens={total}, got {cu[-1]}")
    if max_seqlen is not None:
        longest = max(b - a for a, b in zip(cu, cu[1:]))
        if longest > max_seqlen:
            raise ValueError(f"{op}: max_seqlen must be an int >= the longest sequence ({longest}), got {max_seqlen}")
    return cu


def check_out(op: str, out, shape: tuple[int, ...], like: torch.Tensor, inplace_ok: torch.Tensor | None = None) -> None:
    """`out` must be a tensor of `shape` with like's dtype and device, whose rows have unit column stride; it may
    be `inplace_ok` exactly (same memory and strides), and must not otherwise overlap `like`."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{op}: out must be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{op}: out must have shape {tuple(shape)}, got {tuple(out.shape)}")
    if out.dtype != like.dtype:
        raise TypeError(f"{op}: out must have x's dtype {_dt(like.dtype)}, got {_dt(out.dtype)}")
    if out.device != like.device:
        raise ValueError(f"{op}: out must be on x's device {like.device}, got {out.device}")
    if out.numel() and out.dim() and out.stride(-1) != 1 and out.shape[-1] != 1:  # a size-1 dim's stride is moot
        raise ValueError(f"{op}: out's last dim must have stride 1, got strides {tuple(out.stride())}")
    same = (inplace_ok is not None and out.data_ptr() == inplace_ok.data_ptr()
            and out.stride() == inplace_ok.stride() and out.shape == inplace_ok.shape)
    if not same and out.numel() and like.numel() and _overlap(out, like):
        raise ValueError(f"{op}: out overlaps x other than exactly in place")


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory spans of a and b intersect (conservative: spans, not elements)."""
    def span(t):
        lo = t.data_ptr()
        hi = lo + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) * t.element_size() + t.element_size()
        return lo, hi
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


INT64_MAX = 2 ** 63 - 1


def draw_seed_offset(generator: torch.Generator | None) -> tuple[int, int]:
    """(seed, offset) of a dropout keep-mask: two int64 from `generator`, by default torch's default CPU generator
    whatever the device of the tensors (torch.manual_seed seeds it, so a run is reproducible). Drawing them on a GPU
    generator would read two numbers back to the host, a device synchronization at every call (every layer of every
    training step); a GPU generator given explicitly is still honoured, at that cost."""
    dev = generator.device if generator is not None else torch.device("cpu")
    seed, offset = torch.randint(0, INT64_MAX, (2,), generator=generator, device=dev, dtype=torch.int64).tolist()
    return seed, offset
