"""Kernel benchmarks: every op x fastenc backend against torch eager, torch.compile of the fastenc reference,
and peers when installed (torch SDPA backends, flash-attn, liger-kernel), over shapes taken from BERT-base,
ModernBERT-base and ViT-B/16 plus a long-sequence sweep. Each row carries a bytes/FLOPs model of the op so
times become GB/s or TFLOP/s and a fraction of the machine's ceilings (fastenc.benchmark.ceilings).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

import fastenc
from fastenc import registry, reference, testing
from fastenc.benchmark import timing
from fastenc.ops._common import draw_seed_offset

HEADS, HEAD_DIM, HIDDEN = 12, 64, 768
VARLEN_N, VARLEN_MIN, VARLEN_MAX, VARLEN_SEED = 16, 16, 384, 0


def varlen_lengths(n: int = VARLEN_N, lo: int = VARLEN_MIN, hi: int = VARLEN_MAX, seed: int = VARLEN_SEED) -> list[int]:
    """The variable-length workload: n lengths uniform in [lo, hi], torch.Generator seeded with `seed`."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, (n,), generator=g).tolist()


class UsageError(ValueError):
    """A bad benchmark selection (--ops, --shapes, --models, --providers)."""


@dataclass
class Case:
    """One benchmark point: an op at a shape that a real model (or the sweep) produces.

    lengths: sequence lengths of the batch (token ops see sum(lengths) rows); dims: op-specific sizes.
    """

    op: str
    shape: str
    source: str
    lengths: list[int]
    dims: dict = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)


def _batch(b: int, s: int) -> list[int]:
    return [s] * b


# ---- shapes taken from the models (8 x 128 text batch, 8 x 197 ViT batch) and the sweep ----

def cases(quick: bool = False, sweep: bool | None = None) -> list[Case]:
    """Model-shaped cases (one per op in quick mode) plus, unless quick (or sweep=False), the long sweep."""
    sweep = not quick if sweep is None else sweep
    bert, vit, var = _batch(8, 128), _batch(8, 197), varlen_lengths()
    out = [
        Case("layer_norm", "bert-base 8x128 h768 +res", "BERT-base", bert, {"hidden": HIDDEN, "bias": True, "residual": True}),
        Case("layer_norm", "modernbert-base 8x128 h768 nobias", "ModernBERT-base", bert, {"hidden": HIDDEN, "bias": False, "residual": False}),
        Case("layer_norm", "vit-b16 8x197 h768", "ViT-B/16", vit, {"hidden": HIDDEN, "bias": True, "residual": False}),
        Case("rms_norm", "bert-base 8x128 h768", "BERT-base dims", bert, {"hidden": HIDDEN, "residual": False}),
        Case("rms_norm", "bert-base 8x128 h768 +res", "BERT-base dims", bert, {"hidden": HIDDEN, "residual": True}),
        Case("gelu", "bert-base 8x128 n3072 +bias", "BERT-base", bert, {"n": 3072, "bias": True}),
        Case("gelu", "vit-b16 8x197 n3072 +bias", "ViT-B/16", vit, {"n": 3072, "bias": True}),
        Case("geglu", "modernbert-base 8x128 2x1152", "ModernBERT-base", bert, {"n": 1152}),
        Case("dropout", "bert-base 8x128 h768 p0.1 +bias", "BERT-base", bert, {"n": HIDDEN, "p": 0.1, "bias": True}),
        Case("rope", "modernbert-base 8x128 h12 d64", "ModernBERT-base", bert, {"heads": HEADS, "d": HEAD_DIM}),
        Case("attention", "bert-base 8x128 h12 d64", "BERT-base", bert, {"heads": HEADS, "d": HEAD_DIM, "window": None}),
        Case("attention", "varlen 16x[16,384] h12 d64", "varlen workload", var, {"heads": HEADS, "d": HEAD_DIM, "window": None}),
        Case("attention", "vit-b16 8x197 h12 d64", "ViT-B/16", vit, {"heads": HEADS, "d": HEAD_DIM, "window": None}),
        Case("attention", "modernbert-local 2x1024 w64 h12 d64", "ModernBERT-base", _batch(2, 1024),
             {"heads": HEADS, "d": HEAD_DIM, "window": 64}),
        Case("merge_lora", "bert-base qkv 2304x768 r16", "BERT-base + LoRA", [1], {"out": 3 * HIDDEN, "in": HIDDEN, "r": 16}),
        Case("lora_linear", "bert-base qkv 8x128 768->2304 r16", "BERT-base + LoRA", bert,
             {"out": 3 * HIDDEN, "in": HIDDEN, "r": 16}),
    ]
    if quick:
        keep = {("layer_norm", "BERT-base"), ("rms_norm", "BERT-base dims"), ("gelu", "BERT-base"),
                ("geglu", "ModernBERT-base"), ("dropout", "BERT-base"), ("rope", "ModernBERT-base"),
                ("attention", "BERT-base"), ("attention", "varlen workload"), ("merge_lora", "BERT-base + LoRA"),
                ("lora_linear", "BERT-base + LoRA")}
        seen: set = set()
        quick_cases = []
        for c in out:
            if (c.op, c.source) in keep and (c.op, c.source) not in seen:
                seen.add((c.op, c.source))
                quick_cases.append(c)
        return quick_cases
    if not sweep:
        return out
    for seq in (512, 1024, 2048, 4096):  # long-sequence sweep, batch 1
        one = [seq]
        out += [Case("layer_norm", f"long 1x{seq} h768", "sweep", one, {"hidden": HIDDEN, "bias": True, "residual": False}),
                Case("gelu", f"long 1x{seq} n3072", "sweep", one, {"n": 3072, "bias": True}),
                Case("rope", f"long 1x{seq} h12 d64", "sweep", one, {"heads": HEADS, "d": HEAD_DIM}),
                Case("attention", f"long 1x{seq} h12 d64", "sweep", one, {"heads": HEADS, "d": HEAD_DIM, "window": None})]
    return out


def tiny(case: Case) -> Case:
    """`case` at a few dozen tokens (at most two sequences of <= 16 tokens): the same code path in seconds on a
    CPU, for dry runs of the GPU check."""
    return Case(case.op, case.shape + " (tiny)", case.source, [min(L, 16) for L in case.lengths[:2]], dict(case.dims))


# ---- bytes / FLOPs models: what an ideal kernel must move and compute ----

def _visible_pairs(lengths: list[int], window: int | None) -> int:
    """Number of (query, key) pairs attention computes: L^2 per sequence, or the band |i - j| <= w."""
    total = 0
    for L in lengths:
        if window is None or window >= L:
            total += L * L
        else:
            w = window
            total += L * (2 * w + 1) - w * (w + 1)  # band minus the two cut-off triangles
    return total


def work(case: Case, dtype: torch.dtype) -> tuple[int, int]:
    """(bytes, flops) of `case`: bytes = every input read once + every output written once (esz per element)."""
    e = torch.tensor([], dtype=dtype).element_size()
    T, d = case.tokens, case.dims
    if case.op in ("layer_norm", "rms_norm"):
        h = d["hidden"]
        n_io = 2 + (2 if d.get("residual") else 0)  # x, y (+ residual in, h out)
        params = h * (2 if d.get("bias") else 1)
        return (n_io * T * h + params) * e, 8 * T * h
    if case.op == "gelu":
        n = d["n"]
        return (2 * T * n + (n if d.get("bias") else 0)) * e, 10 * T * n
    if case.op == "geglu":
        n = d["n"]
        return 3 * T * n * e, 11 * T * n
    if case.op == "dropout":  # (x + bias) * keep * scale; the keep-mask's hash (~10 integer ops) not counted
        n = d["n"]
        return (2 * T * n + (n if d.get("bias") else 0)) * e, 2 * T * n
    if case.op == "rope":
        hq = d["heads"] * d["d"]
        return 4 * T * hq * e + T * d["d"] * 4, 3 * 2 * T * hq  # q, k in and out (+ fp32 cos/sin rows)
    if case.op == "attention":
        hd = d["heads"] * d["d"]
        pairs = _visible_pairs(case.lengths, d.get("window"))
        return 4 * T * hd * e, 4 * pairs * hd  # q k v o; QK^T and PV each 2 * pairs * d per head
    if case.op == "merge_lora":
        o, i, r = d["out"], d["in"], d["r"]
        return (2 * o * i + r * (o + i)) * e, 2 * o * i * r + o * i
    if case.op == "lora_linear":
        o, i, r = d["out"], d["in"], d["r"]
        return (T * (i + o) + o * i + o + r * (o + i)) * e, 2 * T * (i * o + r * (i + o))
    raise ValueError(f"work: unknown op {case.op!r}")


def bound(case: Case) -> str:
    """Which ceiling bounds the op: 'memory' (GB/s vs copy bandwidth) or 'compute' (TFLOP/s vs GEMM rate)."""
    return "compute" if case.op in ("attention", "lora_linear") else "memory"


# ---- inputs and providers per op ----

def _rand(*shape, device, dtype, gen, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)


def _cu(lengths: list[int], device) -> torch.Tensor:
    cu = [0]
    for L in lengths:
        cu.append(cu[-1] + L)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def _pad_mask(lengths: list[int], device) -> torch.Tensor:
    s = max(lengths)
    return torch.arange(s, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]


def _pad(x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """(tokens, ...) -> (batch, max_len, ...) zero-padded."""
    s = max(lengths)
    out = x.new_zeros(len(lengths), s, *x.shape[1:])
    start = 0
    for i, L in enumerate(lengths):
        out[i, :L] = x[start:start + L]
        start += L
    return out


def _band_mask(lengths: list[int], window: int | None, device) -> torch.Tensor | None:
    """(batch, 1, S, S) bool mask for SDPA (True = attend), or None when every sequence is full and unbounded."""
    s = max(lengths)
    if window is None and all(L == s for L in lengths):
        return None
    kp = _pad_mask(lengths, device)[:, None, None, :]
    if window is None:
        return kp.expand(len(lengths), 1, s, s)
    i = torch.arange(s, device=device)
    band = (i[None, :] - i[:, None]).abs() <= window
    return kp & band[None, None]


@dataclass
class Setup:
    """Callables of one case: fastenc backend name -> fn, baseline/peer name -> fn, skipped name -> reason."""

    fastenc: dict[str, Callable[[], object]]
    others: dict[str, Callable[[], object]]
    skipped: dict[str, str]
    canon: dict[str, Callable[[object], torch.Tensor]] = field(default_factory=dict)
    reference: tuple | None = None   # (reference fn, *args): the oracle of the tolerance rule
    failed: dict[str, str] = field(default_factory=dict)  # fastenc providers that cannot run here though declared

    def reference_outputs(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """(ref32, ref_lowp) in the fastenc layout: the reference on fp32 copies of the inputs, and (for fp16/bf16)
        the reference computed in the inputs' own precision (testing.tolerance's two terms)."""
        if self.reference is None:
            return None
        fn, *args = self.reference
        up = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        ref32 = self.output("torch-compile", fn(*up)).detach().float()
        lowp = None if dtype == torch.float32 else self.output("torch-compile", fn(*args, upcast=False)).detach()
        return ref32, lowp

    def output(self, name: str, out) -> torch.Tensor:
        """A provider's output in the fastenc layout (first output; packed tokens for attention)."""
        if isinstance(out, (tuple, list)):
            out = out[0]
        return self.canon[name](out) if name in self.canon else out


# Ops whose reference torch.compile is not asked to compile, and why.
NOT_COMPILED = {"dropout": "torch.compile of the reference (its keep-mask's integer hash chain) did not finish "
                           "compiling in 5 minutes on the CPU"}


def _compile(fn: Callable, *args):
    compiled = torch.compile(fn, dynamic=False)
    return lambda: compiled(*args)


def setup(case: Case, device: str, dtype: torch.dtype, compile_ref: bool = True, seed: int = 0) -> Setup:
    """Build inputs for `case` and every provider's zero-argument callable (inputs are made once, outside timing)."""
    g = torch.Generator().manual_seed(seed)
    dev = torch.device(device)
    T, d = case.tokens, case.dims
    fx: dict[str, Callable] = {}
    others: dict[str, Callable] = {}
    skipped: dict[str, str] = {}
    canon: dict[str, Callable] = {}
    ops = fastenc.ops
    if case.op == "layer_norm":
        h = d["hidden"]
        x, w = _rand(T, h, device=dev, dtype=dtype, gen=g), _rand(h, device=dev, dtype=dtype, gen=g)
        b = _rand(h, device=dev, dtype=dtype, gen=g) if d["bias"] else None
        r = _rand(T, h, device=dev, dtype=dtype, gen=g) if d["residual"] else None
        call = lambda be: (lambda: ops.layer_norm(x, w, b, 1e-5, residual=r, backend=be))  # noqa: E731
        sel = {"x": x, "weight": w, "bias": b, "residual": r}
        if r is None:
            others["torch-eager"] = lambda: F.layer_norm(x, (h,), w, b, 1e-5)
        else:
            others["torch-eager"] = lambda: (F.layer_norm(x + r, (h,), w, b, 1e-5))
        ref = (reference.layer_norm_ref, x, w, b, 1e-5, r)
    elif case.op == "rms_norm":
        h = d["hidden"]
        x, w = _rand(T, h, device=dev, dtype=dtype, gen=g), _rand(h, device=dev, dtype=dtype, gen=g)
        r = _rand(T, h, device=dev, dtype=dtype, gen=g) if d["residual"] else None
        call = lambda be: (lambda: ops.rms_norm(x, w, 1e-6, residual=r, backend=be))  # noqa: E731
        sel = {"x": x, "weight": w, "residual": r}
        if r is None:
            others["torch-eager"] = lambda: F.rms_norm(x, (h,), w, 1e-6)
        else:
            others["torch-eager"] = lambda: F.rms_norm(x + r, (h,), w, 1e-6)
        ref = (reference.rms_norm_ref, x, w, 1e-6, r)
    elif case.op == "gelu":
        n = d["n"]
        x = _rand(T, n, device=dev, dtype=dtype, gen=g)
        b = _rand(n, device=dev, dtype=dtype, gen=g) if d["bias"] else None
        call = lambda be: (lambda: ops.gelu(x, b, backend=be))  # noqa: E731
        sel = {"x": x, "bias": b}
        others["torch-eager"] = (lambda: F.gelu(x + b)) if b is not None else (lambda: F.gelu(x))
        ref = (reference.gelu_ref, x, b)
    elif case.op == "geglu":
        n = d["n"]
        x = _rand(T, 2 * n, device=dev, dtype=dtype, gen=g)
        call = lambda be: (lambda: ops.geglu(x, backend=be))  # noqa: E731
        sel = {"x": x}

        def eager():
            a, gate = x.chunk(2, dim=-1)
            return F.gelu(a) * gate
        others["torch-eager"] = eager
        ref = (reference.geglu_ref, x)
    elif case.op == "dropout":
        n, p = d["n"], d["p"]
        x = _rand(T, n, device=dev, dtype=dtype, gen=g)
        b = _rand(n, device=dev, dtype=dtype, gen=g) if d["bias"] else None
        # every fastenc call draws (seed, offset) from a generator seeded alike, so each backend makes the
        # reference's keep-mask (torch's F.dropout draws its own: the same cost, another mask)
        mask_seed, mask_offset = draw_seed_offset(torch.Generator().manual_seed(seed))
        call = lambda be: (lambda: ops.dropout(x, p, bias=b, backend=be,  # noqa: E731
                                               generator=torch.Generator().manual_seed(seed)))
        sel = {"x": x, "bias": b}
        others["torch-eager"] = (lambda: F.dropout(x + b, p)) if b is not None else (lambda: F.dropout(x, p))

        def dropout_ref(x, p, mask_seed, mask_offset, b, upcast=True):  # the reference computes in fp32 either way
            return reference.dropout_ref(x, p, mask_seed, mask_offset, b)
        ref = (dropout_ref, x, p, mask_seed, mask_offset, b)
    elif case.op == "rope":
        hh, hd = d["heads"], d["d"]
        q = _rand(T, hh, hd, device=dev, dtype=dtype, gen=g)
        k = _rand(T, hh, hd, device=dev, dtype=dtype, gen=g)
        cos, sin = reference.rope_cache(hd, max(case.lengths), device=dev)
        cu = _cu(case.lengths, dev)
        pos = torch.cat([torch.arange(L, device=dev, dtype=torch.int32) for L in case.lengths])
        call = lambda be: (lambda: ops.rope(q, k, cos, sin, cu_seqlens=cu, backend=be))  # noqa: E731
        sel = {"q": q, "k": k, "cos": cos, "sin": sin, "positions": pos}
        cos_t, sin_t = torch.cat([cos, cos], -1).to(dtype)[pos.long()][:, None], torch.cat([sin, sin], -1).to(dtype)[pos.long()][:, None]

        def eager():  # transformers' apply_rotary_pos_emb (rotate_half) in the input dtype
            def rot(t):
                t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
                return torch.cat((-t2, t1), dim=-1)
            return q * cos_t + rot(q) * sin_t, k * cos_t + rot(k) * sin_t
        others["torch-eager"] = eager
        ref = (reference.rope_ref, q, k, cos, sin, pos)
    elif case.op == "attention":
        hh, hd, win = d["heads"], d["d"], d["window"]
        q, k, v = (_rand(T, hh, hd, device=dev, dtype=dtype, gen=g) for _ in range(3))
        cu, longest = _cu(case.lengths, dev), max(case.lengths)
        window = None if win is None else (win, win)
        call = lambda be: (lambda: ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=longest, window=window,  # noqa: E731
                                                 backend=be))
        sel = {"q": q, "k": k, "v": v, "cu_seqlens": cu, "max_seqlen": longest,
               "window": (-1, -1) if win is None else (win, win), "scale": hd ** -0.5}
        qp, kp, vp = (_pad(t, case.lengths).transpose(1, 2).contiguous() for t in (q, k, v))  # (b, h, s, d)
        mask = _band_mask(case.lengths, win, dev)
        others["torch-sdpa"] = lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)
        if dev.type == "cuda":
            _sdpa_backends(others, skipped, qp, kp, vp, mask)
            _flash_attn(others, skipped, q, k, v, cu, longest, win)
        kpm = _pad_mask(case.lengths, dev)
        q4, k4, v4 = (_pad(t, case.lengths) for t in (q, k, v))
        ref = (reference.attention_ref, q4, k4, v4, kpm, (-1, -1) if win is None else (win, win))
        canon["torch-compile"] = lambda o: o[kpm]  # (b, s, h, d) padded -> packed
        for n in ("torch-sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn"):
            canon[n] = lambda o: o.transpose(1, 2)[kpm]
    elif case.op == "merge_lora":
        o, i, r = d["out"], d["in"], d["r"]
        w = _rand(o, i, device=dev, dtype=dtype, gen=g)
        a, bb = _rand(r, i, device=dev, dtype=dtype, gen=g), _rand(o, r, device=dev, dtype=dtype, gen=g)
        call = lambda be: (lambda: ops.merge_lora(w, a, bb, 2.0, backend=be))  # noqa: E731
        sel = {"weight": w, "lora_a": a, "lora_b": bb}
        others["torch-eager"] = lambda: torch.addmm(w, bb, a, alpha=2.0)
        ref = (reference.merge_lora_ref, w, a, bb, 2.0)
    elif case.op == "lora_linear":
        o, i, r = d["out"], d["in"], d["r"]
        x = _rand(T, i, device=dev, dtype=dtype, gen=g)
        w, bias = _rand(o, i, device=dev, dtype=dtype, gen=g, scale=i ** -0.5), _rand(o, device=dev, dtype=dtype, gen=g)
        a = _rand(r, i, device=dev, dtype=dtype, gen=g, scale=i ** -0.5)
        bb = _rand(o, r, device=dev, dtype=dtype, gen=g, scale=r ** -0.5)
        call = lambda be: (lambda: ops.lora_linear(x, w, bias, a, bb, 2.0, backend=be))  # noqa: E731
        sel = {"x": x, "weight": w, "bias": bias, "lora_a": a, "lora_b": bb}
        others["torch-eager"] = lambda: F.linear(x, w, bias) + 2.0 * F.linear(F.linear(x, a), bb)  # PEFT's unmerged form
        ref = (reference.lora_linear_ref, x, w, bias, a, bb, 2.0)
    else:
        raise ValueError(f"setup: unknown op {case.op!r}")

    failed: dict[str, str] = {}
    for name, impl in registry.impls(case.op).items():
        # Declared limits (device, dtype, the op's own checks) skip a backend, said so; a backend that should
        # serve these inputs but is unavailable (its extension did not build) is a failure of fastenc.
        why = registry.runs_on(impl, dev, for_speed=True) or "; ".join(testing.cannot_serve(case.op, name, sel))
        if why:
            skipped[f"fastenc-{name}"] = why
            continue
        unavailable = impl.unavailable_reason()
        if unavailable:
            failed[f"fastenc-{name}"] = f"unavailable: {unavailable}"
            continue
        fx[name] = call(name)
    if compile_ref and ref is not None and case.op in NOT_COMPILED:
        skipped["torch-compile"] = NOT_COMPILED[case.op]
    elif compile_ref and ref is not None:
        others["torch-compile"] = _compile(*ref)
    elif ref is None:
        skipped["torch-compile"] = "no reference function to compile"
    if dev.type == "cuda":
        _liger(case, others, skipped, locals())
    return Setup(fx, others, skipped, canon, reference=ref, failed=failed)


def _sdpa_backends(others, skipped, qp, kp, vp, mask):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, be in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION),
                     ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
        def fn(be=be):
            with sdpa_kernel(be):
                return F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)
        try:
            fn()
            others[name] = fn
        except Exception as e:  # backend refuses these inputs (mask, dtype, head dim)
            skipped[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def _flash_attn(others, skipped, q, k, v, cu, longest, win):
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        skipped["flash-attn"] = "flash-attn not installed"
        return
    if q.dtype not in (torch.float16, torch.bfloat16):
        skipped["flash-attn"] = "flash-attn needs fp16/bf16"
        return
    ws = (-1, -1) if win is None else (win, win)
    others["flash-attn"] = lambda: flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=False, window_size=ws)


def _liger(case: Case, others, skipped, env) -> None:
    """liger-kernel's Triton ops where it has the same op (layer_norm, rms_norm, geglu with tanh only)."""
    try:
        import liger_kernel.ops as lk  # noqa: F401
    except ImportError:
        skipped["liger"] = "liger-kernel not installed"
        return
    try:
        if case.op == "layer_norm" and not case.dims.get("residual"):
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction
            x, w, b = env["x"], env["w"], env["b"]
            bb = b if b is not None else torch.zeros_like(w)
            others["liger"] = lambda: LigerLayerNormFunction.apply(x, w, bb, 1e-5)
        elif case.op == "rms_norm" and not case.dims.get("residual"):
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction
            x, w = env["x"], env["w"]
            others["liger"] = lambda: LigerRMSNormFunction.apply(x, w, 1e-6)
        else:
            skipped["liger"] = f"no liger-kernel equivalent for {case.op} at this shape (liger's GeGLU is tanh-only)"
    except Exception as e:
        skipped["liger"] = f"{type(e).__name__}: {e}"[:200]


def run_case(case: Case, device: str, dtype: torch.dtype, ceilings: dict, *, quick: bool = False,
             compile_ref: bool = True, providers: set[str] | None = None, warmup: int = 2,
             repeats: int | None = None, min_time_s: float | None = None) -> list[dict]:
    """Time every provider of `case` interleaved; return one row per provider.

    Baselines and peers that are absent or refuse the inputs carry `skipped` (with the reason); a fastenc
    provider that fails carries `error`, and each timed fastenc row carries `within_tolerance` (the tolerance
    rule of fastenc.testing against the reference): `failures(rows)` lists both kinds."""
    st = setup(case, device, dtype, compile_ref=compile_ref)
    fns = {f"fastenc-{k}": v for k, v in st.fastenc.items()}
    fns.update(st.others)
    if providers:
        fns = {k: v for k, v in fns.items() if k in providers or k.replace("fastenc-", "") in providers}
    nbytes, flops = work(case, dtype)
    rows: list[dict] = []
    good: dict[str, Callable] = {}
    outs: dict[str, torch.Tensor] = {}
    for name, fn in fns.items():  # first call outside timing: builds, compiles, catches failures, keeps the output
        try:
            outs[name] = st.output(name, fn()).detach().float()
            timing.sync(device)
            good[name] = fn
        except Exception as e:
            why = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            (st.failed if name.startswith("fastenc-") else st.skipped)[name] = why
    ref_out = outs.get("fastenc-reference")
    if ref_out is None:
        ref_out = st.output("fastenc-reference", st.fastenc["reference"]()).detach().float() if "reference" in st.fastenc else None
    refs = st.reference_outputs(dtype)
    samples = timing.interleaved(good, device, warmup=warmup, repeats=repeats or (5 if quick else 10),
                                 min_time_s=(0.3 if quick else 1.0) if min_time_s is None else min_time_s,
                                 max_repeats=50 if quick else 200, flush_l2=True)
    bw = ceilings.get("copy_bandwidth", {}).get("value", float("nan"))
    gemm = ceilings.get("gemm_rate", {}).get("value", float("nan"))
    base = {"op": case.op, "shape": case.shape, "source": case.source, "tokens": case.tokens,
            "device": str(device), "dtype": str(dtype).replace("torch.", ""), "bytes": nbytes, "flops": flops,
            "bound": bound(case)}
    medians = {n: timing.summarize(s).median_ms for n, s in samples.items()}
    for name, s in samples.items():
        stats = timing.summarize(s)
        sec = stats.median_ms / 1e3
        gbs = nbytes / sec / 1e9
        tflops = flops / sec / 1e12
        frac = gbs / bw if bound(case) == "memory" else tflops / gemm
        row = dict(base, provider=name, **stats.as_dict(), gb_s=gbs, tflop_s=tflops, frac_of_ceiling=frac)
        o = outs.get(name)
        if ref_out is not None and o is not None and o.shape == ref_out.shape:
            row["max_abs_err_vs_reference"] = float((o - ref_out).abs().max())
        if name.startswith("fastenc-") and refs is not None and o is not None:
            row.update(_tolerance_check(o, refs, dtype))
        for b in ("torch-eager", "torch-sdpa", "torch-compile"):
            if b in medians:
                row[f"speedup_vs_{b.replace('torch-', '')}"] = medians[b] / stats.median_ms
        rows.append(row)
    for kind, reasons in (("error", st.failed), ("skipped", st.skipped)):
        for name, why in reasons.items():
            if providers and name not in providers and name.replace("fastenc-", "") not in providers:
                continue
            rows.append(dict(base, provider=name, **{kind: why}))
    return rows


def _tolerance_check(out: torch.Tensor, refs: tuple, dtype: torch.dtype) -> dict:
    """max error against the fp32 reference and the tolerance rule's bound (NaN never passes)."""
    ref32, lowp = refs
    if out.shape != ref32.shape:
        return {"within_tolerance": False, "tolerance_note": f"shape {tuple(out.shape)} != {tuple(ref32.shape)}"}
    err = float((out.double() - ref32.double()).abs().max()) if out.numel() else 0.0
    tol = testing.tolerance(ref32.cpu(), None if lowp is None else lowp.cpu(), dtype)
    finite = bool(torch.isfinite(out).all())
    return {"max_abs_err_vs_ref32": err, "tolerance": tol, "within_tolerance": finite and err <= tol}


def failures(rows: list[dict]) -> list[str]:
    """What makes a benchmark run fail: fastenc providers that errored or whose output broke the tolerance rule."""
    out = [f"{r['op']} {r['shape']} {r['provider']}: {r['error']}" for r in rows if "error" in r]
    out += [f"{r['op']} {r['shape']} {r['provider']}: max error {r.get('max_abs_err_vs_ref32', float('nan')):.3g} "
            f"> tolerance {r.get('tolerance', float('nan')):.3g}" for r in rows if r.get("within_tolerance") is False]
    return out


def provider_names(op: str, device: str) -> list[str]:
    """Every provider a case of `op` can have on `device` (some may still be skipped at setup)."""
    dev = torch.device(device).type
    names = [f"fastenc-{b}" for b, impl in sorted(registry.impls(op).items(), key=lambda kv: registry.BACKENDS.index(kv[0]))
             if registry.runs_on(impl, dev, for_speed=True) is None]
    names += ["torch-sdpa"] if op == "attention" else ["torch-eager"]
    names.append("torch-compile")
    if dev == "cuda":
        if op == "attention":
            names += ["sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flash-attn"]
        if op in ("layer_norm", "rms_norm"):
            names.append("liger")
    return names


def select_cases(quick: bool, ops: list[str] | None = None, shapes: list[str] | None = None) -> list[Case]:
    known = set(registry.ops())
    out = [c for c in cases(quick) if c.op in known]
    if ops:
        unknown = [o for o in ops if o not in known]
        if unknown:
            raise UsageError(f"--ops: unknown op(s) {unknown}; known: {sorted(known)}")
        out = [c for c in out if c.op in ops]
    if shapes:
        out = [c for c in out if any(s.lower() in c.shape.lower() for s in shapes)]
    return out


__all__ = ["Case", "cases", "select_cases", "setup", "run_case", "failures", "tiny", "work", "bound", "varlen_lengths"]
