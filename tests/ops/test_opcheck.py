"""torch.library.opcheck for every registered fastenc:: custom op on CPU (schema, fake kernel, autograd
registration, AOT dispatch), once per CPU backend of the op (reference, and cpu where registered).

Samples are keyed by the op's schema argument names, so an op registered without a sample here, or whose
schema gains an argument the sample lacks, fails instead of going unchecked.
"""
import pytest
import torch

import fastenc.ops  # noqa: F401  (registers the ops)
from fastenc import registry, testing


def _cu(*lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def _samples() -> dict[str, list[dict]]:
    """op -> list of {argument name: value} (without `backend`); small odd shapes, fp32 and bf16."""
    r = testing.randn
    cos, sin = fastenc.ops.rope_cache(64, 32, 160000.0)
    return {
        "layer_norm": [
            dict(x=r(5, 384), weight=r(384), bias=r(384), residual=r(5, 384), input_bias=None, eps=1e-5,
                 store_residual=True),
            dict(x=r(3, 1000, dtype=torch.bfloat16), weight=r(1000, dtype=torch.bfloat16), bias=None, residual=None,
                 input_bias=r(1000, dtype=torch.bfloat16), eps=1e-12, store_residual=False),
            dict(x=r(7, 768), weight=r(768), bias=r(768), residual=r(7, 768), input_bias=r(768), eps=1e-12,
                 store_residual=False),
        ],
        "rms_norm": [
            dict(x=r(5, 384), weight=r(384), residual=r(5, 384), eps=1e-6),
            dict(x=r(3, 1000, dtype=torch.float16), weight=r(1000, dtype=torch.float16), residual=None, eps=1e-6),
        ],
        **_backward_samples(),
        "gelu": [
            dict(x=r(5, 384), bias=r(384), approximate="none"),
            dict(x=r(3, 1000, dtype=torch.bfloat16), bias=None, approximate="tanh"),
        ],
        "geglu": [dict(x=r(5, 768), approximate="none"), dict(x=r(3, 2000, dtype=torch.float16), approximate="tanh")],
        "gelu_out": [dict(x=r(5, 384), bias=r(384), approximate="none", out=r(5, 384))],
        "geglu_out": [dict(x=r(5, 768), approximate="tanh", out=r(5, 384))],
        "gelu_bwd": [
            dict(grad=r(5, 384), x=r(5, 384), bias=r(384), approximate="none", need_dx=True, need_dbias=True),
            dict(grad=r(3, 1000, dtype=torch.bfloat16), x=r(3, 1000, dtype=torch.bfloat16), bias=None,
                 approximate="tanh", need_dx=True, need_dbias=False),
            dict(grad=r(5, 384), x=r(5, 384), bias=r(384), approximate="tanh", need_dx=False, need_dbias=True),
        ],
        "geglu_bwd": [dict(grad=r(5, 384), x=r(5, 768), approximate="none"),
                      dict(grad=r(3, 1000, dtype=torch.float16), x=r(3, 2000, dtype=torch.float16), approximate="tanh")],
        "rope_bwd": [dict(grad_q=r(7, 3, 64), grad_k=r(7, 1, 64), cos=cos, sin=sin,
                          positions=torch.arange(7, dtype=torch.int32))],
        "rope": [
            dict(q=r(7, 3, 64), k=r(7, 1, 64), cos=cos, sin=sin, positions=torch.arange(7, dtype=torch.int32)),
            dict(q=r(5, 2, 80, dtype=torch.bfloat16), k=r(5, 2, 80, dtype=torch.bfloat16), cos=cos[:, :16],
                 sin=sin[:, :16], positions=torch.tensor([4, 0, 31, 2, 2], dtype=torch.int32)),
        ],
        "attention": [
            dict(q=r(9, 2, 64), k=r(9, 2, 64), v=r(9, 2, 64), cu_seqlens=_cu(4, 5), max_seqlen=5, window_left=-1,
                 window_right=-1, scale=0.125, dropout_p=0.0, seed=0, offset=0),
            dict(q=r(7, 3, 32, dtype=torch.bfloat16), k=r(7, 3, 32, dtype=torch.bfloat16),
                 v=r(7, 3, 32, dtype=torch.bfloat16), cu_seqlens=_cu(7), max_seqlen=7, window_left=2, window_right=1,
                 scale=32 ** -0.5, dropout_p=0.2, seed=5, offset=7),
        ],
        "attention_bwd": [
            dict(grad=r(9, 2, 64), q=r(9, 2, 64), k=r(9, 2, 64), v=r(9, 2, 64), out=r(9, 2, 64),
                 lse=r(2, 9).abs() + 3.0, cu_seqlens=_cu(4, 0, 5), max_seqlen=5, window_left=-1, window_right=-1,
                 scale=0.125, dropout_p=0.0, seed=0, offset=0, need_dq=True, need_dkdv=True),
            dict(grad=r(7, 3, 32, dtype=torch.bfloat16), q=r(7, 3, 32, dtype=torch.bfloat16),
                 k=r(7, 3, 32, dtype=torch.bfloat16), v=r(7, 3, 32, dtype=torch.bfloat16),
                 out=r(7, 3, 32, dtype=torch.bfloat16), lse=r(3, 7).abs() + 3.0, cu_seqlens=_cu(7), max_seqlen=7,
                 window_left=2, window_right=1, scale=32 ** -0.5, dropout_p=0.2, seed=5, offset=7, need_dq=False,
                 need_dkdv=True),
        ],
        "dropout": [dict(x=r(5, 384), bias=r(384), dropout_p=0.1, seed=3, offset=9),
                    dict(x=r(3, 1000), bias=None, dropout_p=0.5, seed=-4, offset=0)],
        "dropout_bwd": [dict(grad=r(5, 384), dropout_p=0.1, seed=3, offset=9)],
        "merge_lora": [dict(weight=r(48, 40), lora_a=r(8, 40), lora_b=r(48, 8), scale=2.0)],
        "lora_linear": [
            dict(x=r(5, 40), weight=r(48, 40), bias=r(48), lora_a=r(8, 40), lora_b=r(48, 8), scale=0.5),
            dict(x=r(3, 40), weight=r(48, 40), bias=None, lora_a=r(4, 40), lora_b=r(48, 4), scale=1.0),
        ],
    }


def _backward_samples() -> dict[str, list[dict]]:
    """Norm and LoRA training: forwards with grad-requiring inputs (opcheck's autograd checks run their backward)
    and the backward ops themselves."""
    r = testing.randn

    def g(*shape, dtype=torch.float32):
        return r(*shape, dtype=dtype).requires_grad_()

    h = r(5, 384)
    mean, rstd = h.mean(-1), torch.rsqrt(h.var(-1, unbiased=False) + 1e-5)
    return {
        "layer_norm_train": [
            dict(x=g(5, 384), weight=g(384), bias=g(384), residual=g(5, 384), input_bias=g(384), eps=1e-5,
                 store_residual=True, stats=True),
            dict(x=g(3, 1001, dtype=torch.bfloat16), weight=g(1001, dtype=torch.bfloat16), bias=None, residual=None,
                 input_bias=None, eps=1e-5, store_residual=False, stats=True),
        ],
        "rms_norm_train": [
            dict(x=g(5, 384), weight=g(384), residual=g(5, 384), eps=1e-6, stats=True),
            dict(x=g(3, 1001), weight=None, residual=None, eps=1e-6, stats=True),
        ],
        "lora_linear_train": [
            dict(x=g(5, 40), weight=r(48, 40), bias=r(48), lora_a=g(8, 40), lora_b=g(48, 8), scale=0.5),
            dict(x=g(3, 40), weight=g(48, 40), bias=g(48), lora_a=g(4, 40), lora_b=g(48, 4), scale=1.0),
        ],
        "layer_norm_bwd": [
            dict(dy=r(5, 384), dh=r(5, 384), h=h, weight=r(384), mean=mean, rstd=rstd, need_weight=True,
                 need_bias=True),
            dict(dy=r(5, 384), dh=None, h=h, weight=r(384), mean=mean, rstd=rstd, need_weight=False, need_bias=False),
        ],
        "rms_norm_bwd": [
            dict(dy=r(5, 384), dh=r(5, 384), h=h, weight=r(384), rstd=rstd, need_weight=True),
            dict(dy=r(5, 384), dh=None, h=h, weight=None, rstd=rstd, need_weight=False),
        ],
        "lora_linear_bwd": [
            dict(dy=r(5, 48), x=r(5, 40), weight=r(48, 40), lora_a=r(8, 40), lora_b=r(48, 8), scale=0.5, need_x=True,
                 need_weight=False, need_bias=False, need_a=True, need_b=True),
            dict(dy=r(3, 48), x=r(3, 40), weight=r(48, 40), lora_a=r(4, 40), lora_b=r(48, 4), scale=2.0,
                 need_x=True, need_weight=True, need_bias=True, need_a=True, need_b=True),
        ],
    }


def _cpu_backends(op):
    return [b for b, impl in registry.impls(op).items() if b in ("reference", "cpu") and "cpu" in impl.devices]


CASES = [pytest.param(op, be, id=f"{op}-{be}") for op in registry.ops() for be in _cpu_backends(op)]


def test_every_op_has_a_cpu_backend():
    assert {c.values[0] for c in CASES} == set(registry.ops())


@pytest.mark.parametrize("op,backend", CASES)
def test_opcheck(op, backend):
    samples = _samples()
    for name in ("layer_norm", "rms_norm"):  # inference forwards (stats=False); training ones below
        samples[name] = [dict(s, stats=False) for s in samples[name]] + samples.pop(name + "_train")
    samples["lora_linear"] = samples["lora_linear"] + samples.pop("lora_linear_train")
    assert op in samples, f"fastenc::{op} has no opcheck sample in tests/ops/test_opcheck.py; add one"
    custom = getattr(torch.ops.fastenc, op).default
    names = [a.name for a in custom._schema.arguments]
    for sample in samples[op]:
        missing = [n for n in names if n != "backend" and n not in sample]
        assert not missing, f"fastenc::{op} sample lacks arguments {missing} (schema: {custom._schema})"
        args = tuple(backend if n == "backend" else sample[n] for n in names)
        torch.library.opcheck(custom, args)


def _out_samples():
    """The `out=` variants (mutating ops, not registry entries of their own): (op, base op, sample)."""
    r = testing.randn
    return [
        ("gelu_out", "gelu", dict(x=r(5, 384), bias=r(384), approximate="none", out=r(5, 384))),
        ("gelu_out", "gelu", dict(x=r(3, 1000, dtype=torch.bfloat16), bias=None, approximate="tanh",
                                  out=r(3, 1000, dtype=torch.bfloat16))),
        ("geglu_out", "geglu", dict(x=r(5, 768), approximate="none", out=r(5, 384))),
    ]


@pytest.mark.parametrize("op,base,sample", [pytest.param(o, b, s, id=f"{o}-{i}") for i, (o, b, s)
                                            in enumerate(_out_samples())])
def test_opcheck_out_variants(op, base, sample):
    custom = getattr(torch.ops.fastenc, op).default
    names = [a.name for a in custom._schema.arguments]
    for backend in _cpu_backends(base):
        args = tuple(backend if n == "backend" else sample[n].clone() if isinstance(sample[n], torch.Tensor)
                     else sample[n] for n in names)
        torch.library.opcheck(custom, args)


def test_backward_through_an_op_raises_naming_it():
    x = testing.randn(5, 64).requires_grad_(True)
    y = fastenc.ops.merge_lora(x, testing.randn(4, 64), testing.randn(5, 4), 1.0, backend="reference")
    assert y.requires_grad  # the autograd kernel is registered (outside inference mode): no silent zero gradient
    with pytest.raises(RuntimeError, match="fastenc::merge_lora has no backward"):
        y.sum().backward()
    with torch.inference_mode():
        assert not fastenc.ops.gelu(x.detach(), backend="cpu").requires_grad


def test_ops_under_torch_compile_match_eager():
    # aot_eager runs the traced graph through the fake kernels and AOT dispatch without a C++ compile step;
    # the dispatch in the public functions (registry.select) traces too (tests/ops/test_compile.py: fullgraph).
    w, b = testing.randn(96), testing.randn(96)

    def block(x, r):
        y, h = fastenc.ops.layer_norm(x, w, b, residual=r)
        return fastenc.ops.gelu(y, bias=b), h

    compiled = torch.compile(block, backend="aot_eager")
    for n in (7, 13):  # a second shape: the recompiled graph must run too
        x, r = testing.randn(n, 96), testing.randn(n, 96)
        for got, want in zip(compiled(x, r), block(x, r)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
