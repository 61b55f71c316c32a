"""Kernel benchmarks: every op x fastenc backend against torch eager, torch.compile of the fastenc reference,
and peers when installed (torch SDPA backends, flash-attn, liger-kernel), over the cases each op's benchmark spec
declares (fastenc/benchmark/ops/<op>.py: shapes taken from BERT-base, ModernBERT-base and ViT-B/16 plus a
long-sequence sweep). Each row carries the spec's bytes/FLOPs model of the op so times become GB/s or TFLOP/s and
a fraction of the machine's ceilings (fastenc.benchmark.ceilings).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from fastenc import registry, testing
from fastenc.benchmark import ops as op_specs
from fastenc.benchmark import timing
from fastenc.benchmark.ops._common import Case, varlen_lengths
from fastenc.benchmark.options import UsageError


def cases(quick: bool = False, sweep: bool | None = None) -> list[Case]:
    """Every spec's model-shaped cases plus, unless quick (or sweep=False), the long sweep; quick: the cases the
    specs mark quick (no sweep)."""
    if quick:
        return [c for c in op_specs.forward_cases(sweep=False) if c.quick]
    return op_specs.forward_cases(sweep=True if sweep is None else sweep)


def tiny(case: Case) -> Case:
    """`case` at a few dozen tokens (at most two sequences of <= 16 tokens): the same code path in seconds on a
    CPU, for dry runs of the GPU check."""
    return Case(case.op, case.shape + " (tiny)", case.source, [min(L, 16) for L in case.lengths[:2]], dict(case.dims),
                case.quick)


def work(case: Case, dtype: torch.dtype) -> tuple[int, int]:
    """(bytes, flops) of `case`: bytes = every input read once + every output written once (esz per element)."""
    return op_specs.spec(case.op).work(case, torch.tensor([], dtype=dtype).element_size())


def bound(case: Case) -> str:
    """Which ceiling bounds the op: 'memory' (GB/s vs copy bandwidth) or 'compute' (TFLOP/s vs GEMM rate)."""
    return op_specs.spec(case.op).BOUND


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


def _compile(fn: Callable, *args):
    compiled = torch.compile(fn, dynamic=False)
    return lambda: compiled(*args)


def setup(case: Case, device: str, dtype: torch.dtype, compile_ref: bool = True, seed: int = 0) -> Setup:
    """Build inputs for `case` (its spec's set-up) and every provider's zero-argument callable (inputs are made
    once, outside timing)."""
    dev = torch.device(device)
    inp = op_specs.spec(case.op).setup(case, dev, dtype, torch.Generator().manual_seed(seed), seed)
    others, skipped, ref = dict(inp.others), dict(inp.skipped), inp.reference
    fx: dict[str, Callable] = {}
    failed: dict[str, str] = {}
    for name, impl in registry.impls(case.op).items():
        # Declared limits (device, dtype, the op's own checks) skip a backend, said so; a backend that should
        # serve these inputs but is unavailable (its extension did not build) is a failure of fastenc.
        why = registry.runs_on(impl, dev, for_speed=True) or "; ".join(testing.cannot_serve(case.op, name, inp.sel))
        if why:
            skipped[f"fastenc-{name}"] = why
            continue
        unavailable = impl.unavailable_reason()
        if unavailable:
            failed[f"fastenc-{name}"] = f"unavailable: {unavailable}"
            continue
        fx[name] = inp.call(name)
    not_compiled = op_specs.not_compiled(case.op)
    if compile_ref and ref is not None and not_compiled:
        skipped["torch-compile"] = not_compiled
    elif compile_ref and ref is not None:
        others["torch-compile"] = _compile(*ref)
    elif ref is None:
        skipped["torch-compile"] = "no reference function to compile"
    if dev.type == "cuda":
        _liger(case, inp.liger, others, skipped)
    return Setup(fx, others, skipped, dict(inp.canon), reference=ref, failed=failed)


def _liger(case: Case, make, others, skipped) -> None:
    """liger-kernel's Triton op where the spec names one at this case (layer_norm, rms_norm without residual)."""
    try:
        import liger_kernel.ops as lk  # noqa: F401
    except ImportError:
        skipped["liger"] = "liger-kernel not installed"
        return
    if make is None:
        skipped["liger"] = f"no liger-kernel equivalent for {case.op} at this shape (liger's GeGLU is tanh-only)"
        return
    try:
        others["liger"] = make()
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
    names += list(op_specs.baselines(op))
    names.append("torch-compile")
    if dev == "cuda":
        names += list(op_specs.cuda_peers(op))
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


__all__ = ["Case", "cases", "select_cases", "setup", "run_case", "failures", "tiny", "work", "bound", "varlen_lengths",
           "provider_names", "UsageError"]
