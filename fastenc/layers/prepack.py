"""Prepacked weights for the CPU GEMMs of fastenc.layers.Linear in inference, so no call re-packs the weight
panels the way an unpacked sgemm does on every call.

With fastenc's extension loaded (any model forward loads it), the weight is packed once into 16-column panels for
fastenc's own GEMM (csrc/cpu/gemm.cpp through fastenc.ops.direct, `use_panels`), at every row count; it also does
the residual form out += x @ W.T in place and takes the bias and the MLP's GELU into its epilogue. Without the
extension the (out, in) fp32 weight is reordered into oneDNN's blocked layout (torch.ops.mkldnn
._reorder_linear_weight) and multiplied by torch.ops.mkldnn._linear_pointwise, from `min_rows(w)` rows of x
(MIN_TOKENS for a weight of LARGE_WEIGHT elements or more, MIN_TOKENS_SMALL below) and weights of MIN_WEIGHT
elements or more: oneDNN's fixed cost per call loses at a few rows.

From CHOICE_MIN_ROWS rows the panel GEMM runs only where it was measured no slower than torch's own GEMM for that
(octave of rows, weight shape, thread count) in this process (`panels_chosen`; FASTENC_GEMM fixes the answer);
otherwise torch's plain GEMM runs (`gemm_path` gives a call's path).

A packed path runs only for CPU fp32 activations and weight, x 2-D, grad disabled (torch.no_grad /
inference_mode; the weight may require grad: nothing is recorded), not under torch.compile tracing, a weight that
is not an inference tensor (its in-place writes would go unseen), FASTENC_PREPACK not "0", and the registry
admitting the cpu backend (not under use_backend("reference")); everything else, training included, takes the
plain torch GEMM. The rule is one size compare and one row compare per call; the measurements behind its
thresholds (`python -m fastenc.benchmark.gemm_pack`) are in bench/results/HISTORY.md and
bench/results/latency/gemm_pack*.json.

The pack is a cache beside the plain weight, never a parameter or buffer: state_dict, save_pretrained, .to(),
deepcopy/pickle and training see the plain tensor only. It is keyed on the weight object (a weak reference), its
storage pointer, its version counter and the count of optimizer steps (fastenc/layers/steps.py: torch's fused
optimizers bump no version counter), so an in-place write (LoRA merge/unmerge, load_state_dict, any optimizer
step), a move or a replaced parameter rebuilds it at the next call. It costs a second copy of each packed weight.
"""
from __future__ import annotations

import contextlib
import os
import weakref

import torch

from fastenc import extension, registry
from fastenc.layers.steps import optimizer_steps
from fastenc.ops import direct
from fastenc.ops.direct import GEMM_EVENT  # noqa: F401  (the profiler name of panel_gemm)

MIN_TOKENS = 16  # rows of x from which a large weight's GEMM is packed (the measured crossover; module docstring)
MIN_TOKENS_SMALL = 64  # rows from which a weight under LARGE_WEIGHT elements is packed
LARGE_WEIGHT = 1 << 20  # in x out elements from which MIN_TOKENS applies (BERT-base's QKV, fc1, fc2: 1.8M, 2.4M)
MIN_WEIGHT = 1 << 17  # in x out elements from which a weight is packed at all (MiniLM's 384 x 384 blocks: 147,456)


def min_rows(w: torch.Tensor) -> int:
    """Rows of x from which y = x @ w.T takes the packed GEMM, by the weight's size: MIN_TOKENS for a weight of at
    least LARGE_WEIGHT elements, MIN_TOKENS_SMALL below it (no packing under MIN_WEIGHT: see `use_packed`)."""
    return MIN_TOKENS if w.numel() >= LARGE_WEIGHT else MIN_TOKENS_SMALL


class PackCache:
    """The packed form of one Linear's weight (split into `parts` row blocks), rebuilt when the weight changes.
    panels=True: the panel GEMM's panels (fastenc's extension, `use_panels`) instead of oneDNN's layout.
    Not copied by deepcopy or pickle (a copy starts empty and packs its own weight on first use)."""

    __slots__ = ("ref", "ptr", "version", "parts", "packed", "panels")

    def __init__(self, panels: bool = False):
        self.ref, self.ptr, self.version, self.parts, self.packed, self.panels = None, 0, None, 0, (), panels

    def get(self, w: torch.Tensor, parts: int = 1) -> tuple[torch.Tensor, ...]:
        """w: (out, in) fp32 -> `parts` packed (out/parts, in) blocks, [w_0; w_1; ...] in row order."""
        version = (w._version, optimizer_steps())
        if (self.ref is None or self.ref() is not w or self.ptr != w.data_ptr() or self.version != version
                or self.parts != parts):
            blocks = w.detach().view(parts, w.shape[0] // parts, w.shape[1]).unbind(0)
            pack = direct.gemm_pack if self.panels else (
                lambda b: torch.ops.mkldnn._reorder_linear_weight(b, None))
            self.packed = tuple(pack(b.contiguous()) for b in blocks)
            self.ref, self.ptr, self.version, self.parts = weakref.ref(w), w.data_ptr(), version, parts
        return self.packed

    def clear(self) -> None:
        self.__init__(self.panels)

    def __deepcopy__(self, memo):
        return PackCache(self.panels)

    def __reduce__(self):
        return (PackCache, (self.panels,))


_ENABLED: list[bool] = []  # FASTENC_PREPACK and oneDNN's presence, read at the first call (nothing at import)


def _enabled(onednn: bool = False) -> bool:
    """FASTENC_PREPACK not "0" (and, onednn=True, torch built with oneDNN)."""
    if not _ENABLED:
        _ENABLED.extend((os.environ.get("FASTENC_PREPACK", "1") != "0", torch.backends.mkldnn.is_available()))
    return _ENABLED[0] and (_ENABLED[1] or not onednn)


def use_packed(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether y = x @ w.T takes the packed GEMM (the rule in the module docstring). x: (rows, in); w: (out, in)."""
    return (x.dim() == 2 and x.shape[0] >= min_rows(w) and w.numel() >= MIN_WEIGHT and x.dtype == torch.float32 and w.dtype == torch.float32
            and x.device.type == "cpu" and w.device.type == "cpu" and not torch.is_grad_enabled()
            and not w.is_inference() and not torch.compiler.is_compiling()
            and _enabled(onednn=True) and registry.backend_allowed("cpu"))


def use_panels(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether y = x @ w.T takes fastenc's GEMM on its own panels (csrc/cpu/gemm.cpp): the conditions of
    `use_packed` on dtype, device, grad and tracing, at least one row of x, and the extension loaded (nothing is
    built for it). x: (rows, in); w: (out, in)."""
    return (x.dim() == 2 and x.shape[0] > 0 and x.stride(1) == 1 and x.dtype == torch.float32 and w.dtype == torch.float32
            and x.device.type == "cpu" and w.device.type == "cpu" and not torch.is_grad_enabled()
            and not w.is_inference() and not torch.compiler.is_compiling() and _enabled()
            and extension.loaded() and registry.backend_allowed("cpu"))


CHOICE_MIN_ROWS = 128  # rows of x from which the panel GEMM and torch's GEMM are measured against each other
_CHOICE: dict = {}  # (row octave, in, out, threads) -> True: the panel GEMM won, False: torch's GEMM won
_MODE: list[str] = []  # FASTENC_GEMM, read at the first choice


def gemm_mode() -> str:
    """FASTENC_GEMM: "auto" (default: measure, see `panels_chosen`), "panels" or "torch" (always that GEMM)."""
    if not _MODE:
        mode = os.environ.get("FASTENC_GEMM", "auto")
        if mode not in ("auto", "panels", "torch"):
            raise ValueError(f"FASTENC_GEMM must be 'auto', 'panels' or 'torch', got {mode!r}")
        _MODE.append(mode)
    return _MODE[0]


@contextlib.contextmanager
def pinned(mode: str):
    """Inside the block every inference GEMM from CHOICE_MIN_ROWS rows takes `mode` ("panels" or "torch") instead of
    the measured choice, when FASTENC_GEMM is "auto" (an explicit FASTENC_GEMM is kept). Process-wide. With the
    panel GEMM each row of the output depends on that row of x alone, so results do not depend on how the rows were
    batched or on a timing (the corpus job's windows run under pinned("panels"))."""
    if mode not in ("panels", "torch"):
        raise ValueError(f"pinned: mode must be 'panels' or 'torch', got {mode!r}")
    if gemm_mode() != "auto":
        yield
        return
    _MODE[0] = mode
    try:
        yield
    finally:
        _MODE[0] = "auto"


def panels_chosen(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether a call that may take the panel GEMM (`use_panels`) should, rather than torch's own GEMM (MKL's sgemm
    on x86 builds). Below CHOICE_MIN_ROWS rows: yes (no packing of x to repay, and the epilogues fuse the bias,
    GELU and residual). From there the faster of the two differs by CPU, so the first call of each (octave of rows,
    in, out, threads) times both on its own x and w (`measure_choice`) and later calls of that key reuse the answer.
    FASTENC_GEMM="panels" / "torch" fixes the answer instead."""
    mode = gemm_mode()
    if mode != "auto":
        return mode == "panels"
    m = x.shape[0]
    if m < CHOICE_MIN_ROWS:
        return True
    key = (m.bit_length(), w.shape[1], w.shape[0], torch.get_num_threads())
    got = _CHOICE.get(key)
    if got is None:
        got = _CHOICE[key] = measure_choice(x, w)
    return got


def measure_choice(x: torch.Tensor, w: torch.Tensor, rounds: int = 3) -> bool:
    """True when the panel GEMM computes x @ w.T (no bias) in no more time than torch.mm: the best of `rounds`
    interleaved calls of each, on a fresh pack of w and one output buffer. Grad mode off (the caller's). x: the
    call's (rows, in) input; one of another width stands for its row count only (random rows of w's width are
    timed instead)."""
    import time

    if x.shape[1] != w.shape[1] or x.stride(1) != 1:
        x = torch.randn(x.shape[0], w.shape[1], dtype=x.dtype)
    n = w.shape[0]
    wd = w.detach()
    panels = direct.gemm_pack(wd.contiguous())
    wt = wd.t()
    out = extension.buffer_empty((x.shape[0], n), x)
    best_panels = best_torch = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        direct.gemm_packed(x, panels, n, None, out)
        t1 = time.perf_counter()
        torch.mm(x, wt, out=out)
        t2 = time.perf_counter()
        best_panels, best_torch = min(best_panels, t1 - t0), min(best_torch, t2 - t1)
    return best_panels <= best_torch


def gemm_path(x: torch.Tensor, w: torch.Tensor) -> str | None:
    """The GEMM an inference call y = x @ w.T takes: "panels" (`use_panels` and `panels_chosen`), "onednn"
    (`use_packed`, while the panels are not available), or None: torch's plain GEMM."""
    if use_panels(x, w):
        return "panels" if panels_chosen(x, w) else None
    return "onednn" if use_packed(x, w) else None


def panel_gemm(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None,
               out: torch.Tensor | None = None, accumulate: bool = False, gelu: str | None = None) -> torch.Tensor:
    """x @ W.T (+ bias) with W packed by PackCache(panels=True) (n rows): into `out` ((rows, n), unit column
    stride) when given, added to it when accumulate; else a new tensor. gelu ("none": exact, "tanh"): gelu of
    that, in the GEMM's epilogue. x: (rows, in) fp32, unit column stride.
    Under the profiler the call is recorded as "fastenc::gemm_packed MxKxN" (fastenc.ops.direct.gemm_packed)."""
    return direct.gemm_packed(x, panels, n, bias, out, accumulate, gelu)


ROW_BUCKET_BITS = 4  # packed GEMMs run on rows rounded up to 1/16 of their power of two (`packed_rows`)


def packed_rows(m: int) -> int:
    """The rows the packed GEMM runs for m rows of x: m rounded up to a multiple of 2^(floor(log2 m) - 4) (m itself
    below 32). oneDNN keeps state for every row count it multiplies (its primitive cache and more: ~0.7-1.1 MiB
    each, measured with MiniLM forwards of distinct token counts, and not returned when its cache evicts), and an
    unpadded job sees a new row count in nearly every batch, so its memory grew with the corpus (MiniLM, 300
    forwards of distinct token counts from 135 to 1,500, one thread: 537 -> 859 MiB resident; rounded: 473 -> 495).
    Rounded, the row counts from 2^j to 2^(j+1) fall on 16 values, and the padding costs under 1/16 of the GEMM
    (~2 % on average; none at a multiple of the step, e.g. 8 x 128 = 1024 rows)."""
    if m < 32:
        return m
    step = 1 << (m.bit_length() - 1 - ROW_BUCKET_BITS)
    return -(-m // step) * step


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W.T (+ bias) with W packed by PackCache. x: (rows, in) fp32 -> (rows, out) fp32, a new tensor (the
    first rows of one computed for `packed_rows(rows)` rows, the rows past x's zero: contiguous all the same)."""
    m = x.shape[0]
    mp = packed_rows(m)
    if mp != m:
        xp = x.new_empty((mp, x.shape[1]))
        xp[:m].copy_(x)
        xp[m:].zero_()
        return torch.ops.mkldnn._linear_pointwise(xp, packed, bias, "none", [], "")[:m]
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

