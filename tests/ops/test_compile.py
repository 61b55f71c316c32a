"""torch.compile(fullgraph=True) over fastenc ops: a training step and an inference forward trace with no graph
break (the backend choice is resolved while tracing, see fastenc/registry.py) and give eager's loss, gradients,
update and outputs. aot_eager: the forward and the backward graphs go through AOTAutograd and the ops' fake
kernels, with no C++ code generation (seconds, not minutes, on CPU)."""
import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import fastenc
from fastenc import ops, registry
from fastenc.testing import assert_close, randn

HIDDEN, HEADS, FFN, RANK = 48, 3, 40, 4
LENGTHS = (5, 1, 11)  # odd lengths, one of a single token
LR = 0.05


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


class Block(torch.nn.Module):
    """Pre-norm encoder block from fastenc ops: layer_norm with residual, fused QKV GEMM, rope, varlen attention,
    LoRA output projection, gelu with bias, geglu, rms_norm."""

    def __init__(self):
        super().__init__()
        h, d = HIDDEN, HIDDEN // HEADS
        p = lambda *shape, s=1.0: torch.nn.Parameter(randn(*shape, scale=s))  # noqa: E731
        self.ln_w, self.ln_b = p(h), p(h, s=0.1)
        self.wqkv = p(3 * h, h, s=h ** -0.5)
        self.wo, self.bo = p(h, h, s=h ** -0.5), p(h, s=0.1)
        self.lora_a, self.lora_b = p(RANK, h, s=h ** -0.5), p(h, RANK, s=0.1)
        self.w1, self.b1 = p(FFN, h, s=h ** -0.5), p(FFN, s=0.1)
        self.w2 = p(2 * FFN, FFN, s=FFN ** -0.5)
        self.w3 = p(h, FFN, s=FFN ** -0.5)
        self.rms_w = p(h)
        cos, sin = ops.rope_cache(d, 32)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, x, residual, cu_seqlens):
        t = x.shape[0]
        y, h = ops.layer_norm(x, self.ln_w, self.ln_b, residual=residual)
        q, k, v = (y @ self.wqkv.t()).view(t, 3, HEADS, HIDDEN // HEADS).unbind(1)
        q, k = ops.rope(q, k, self.cos, self.sin, cu_seqlens=cu_seqlens)
        a = ops.attention(q, k, v, cu_seqlens=cu_seqlens).reshape(t, HIDDEN)
        o = ops.lora_linear(a, self.wo, self.bo, self.lora_a, self.lora_b, 2.0)
        u = ops.gelu(o @ self.w1.t(), bias=self.b1)
        g = ops.geglu(u @ self.w2.t())
        z, _ = ops.rms_norm(g @ self.w3.t(), self.rms_w, residual=h)
        return z


def _inputs():
    t = sum(LENGTHS)
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    return randn(t, HIDDEN), randn(t, HIDDEN), cu


def _loss(block, x, residual, cu_seqlens):
    return (block(x, residual, cu_seqlens) ** 2).mean()


def _sgd(params):
    with torch.no_grad():
        torch._foreach_add_(params, [p.grad for p in params], alpha=-LR)


def _assert_no_graph_break():
    assert not counters["graph_break"], f"graph breaks: {dict(counters['graph_break'])}"


def test_training_step_compiles_fullgraph_and_matches_eager():
    eager = Block()
    compiled = Block()
    compiled.load_state_dict(eager.state_dict())
    x, r, cu = _inputs()
    loss_fn = torch.compile(_loss, fullgraph=True, backend="aot_eager")
    opt = torch.optim.SGD(eager.parameters(), lr=LR)
    step = torch.compile(_sgd, fullgraph=True, backend="aot_eager")  # (torch.optim's step breaks graphs itself)

    want = _loss(eager, x, r, cu)
    want.backward()
    got = loss_fn(compiled, x, r, cu)
    got.backward()
    _assert_no_graph_break()
    assert_close(got, want.detach(), name="loss")
    for (name, pe), pc in zip(eager.named_parameters(), compiled.parameters()):
        assert pe.grad is not None and pc.grad is not None, name
        assert_close(pc.grad, pe.grad, name=f"grad {name}")
    opt.step()
    step(list(compiled.parameters()))
    _assert_no_graph_break()
    for (name, pe), pc in zip(eager.named_parameters(), compiled.parameters()):
        assert_close(pc.detach(), pe.detach(), name=f"updated {name}")
    # the updated weights flow through the same compiled graph (no retrace: same shapes and requires_grad)
    assert_close(loss_fn(compiled, x, r, cu).detach(), _loss(eager, x, r, cu).detach(), name="second loss")


def test_inference_forward_compiles_fullgraph_and_checks_cu_seqlens_every_call():
    """The same outputs as eager; cu_seqlens' values are read in the graph, per call: a bad one raises the eager
    error before any kernel runs."""
    block = Block().eval()
    x, r, cu = _inputs()
    fwd = torch.compile(block, fullgraph=True, backend="aot_eager")
    with torch.inference_mode():
        want = block(x, r, cu)
        got = fwd(x, r, cu)
        _assert_no_graph_break()
        assert_close(got, want)
        bad = cu.clone()
        bad[1] = int(cu[2]) + 1  # a sequence ending after the next one's end
        with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
            fwd(x, r, bad)


def test_compiled_graph_uses_the_choice_in_force_when_traced():
    """The backend argument and use_backend are resolved while tracing; the custom op gets the name as a constant."""
    x = randn(7, 96)
    seen = []

    def gelu(t):
        return ops.gelu(t)

    real = registry.impl("gelu", "reference").fn
    with fastenc.use_backend("reference"):
        graph = torch.compile(gelu, fullgraph=True, backend=lambda gm, _: (seen.append(gm.code), gm)[1])
        with torch.inference_mode():
            assert_close(graph(x), real(x, None, "none"))
    assert any("'reference'" in code for code in seen), seen
    seen.clear()
    explicit = torch.compile(lambda t: ops.gelu(t, backend="reference"), fullgraph=True,
                             backend=lambda gm, _: (seen.append(gm.code), gm)[1])
    with torch.inference_mode():
        assert_close(explicit(x), real(x, None, "none"))
    assert any("'reference'" in code for code in seen), seen
    _assert_no_graph_break()


@pytest.mark.parametrize("window, max_seqlen", [((2, 3), None), (40, 16)], ids=["window-2-3", "window-40-max16"])
def test_windowed_varlen_attention_compiles_fullgraph(window, max_seqlen):
    """A window and a caller's max_seqlen are compared with the longest length, symbolic while tracing: the
    comparison runs in the graph (a window wider than every sequence bounds nothing, as in eager)."""
    x, _, cu = _inputs()
    q, k, v = (randn(x.shape[0], HEADS, 8).requires_grad_() for _ in range(3))

    def f(q, k, v, cu):
        return ops.attention(q, k, v, cu_seqlens=cu, max_seqlen=max_seqlen, window=window)

    want = f(q, k, v, cu)
    (gq, gk, gv) = torch.autograd.grad(want.square().sum(), (q, k, v))
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, cu)
    _assert_no_graph_break()
    assert_close(got.detach(), want.detach())
    for name, g, w in zip("qkv", torch.autograd.grad(got.square().sum(), (q, k, v)), (gq, gk, gv)):
        assert_close(g, w, name=f"d{name}")


def test_compiled_attention_checks_max_seqlen_every_call():
    x, _, cu = _inputs()
    q = randn(x.shape[0], HEADS, 8)
    f = torch.compile(lambda q, cu: ops.attention(q, q, q, cu_seqlens=cu, max_seqlen=max(LENGTHS)), fullgraph=True,
                      backend="aot_eager")
    with torch.inference_mode():
        f(q, cu)
        short = torch.tensor([0, 1, 2, x.shape[0]], dtype=torch.int32)  # a last sequence longer than max_seqlen
        with pytest.raises(Exception, match="max_seqlen must be an int >= the longest sequence"):
            f(q, short)


def test_swiglu_both_forms_compile_fullgraph_with_backward():
    """A LLaMA-style gated MLP through swiglu's two forms (fused [gate | up] and separate projections) traces with no
    graph break and gives eager's outputs and gradients."""
    w_fused, w_gate, w_up = randn(2 * FFN, HIDDEN), randn(FFN, HIDDEN), randn(FFN, HIDDEN)

    def mlp(x, wf, wg, wu):
        return ops.swiglu(x @ wf.t()) + ops.swiglu(x @ wg.t(), x @ wu.t())

    leaves = [t.requires_grad_(True) for t in (randn(11, HIDDEN), w_fused, w_gate, w_up)]
    twins = [t.detach().clone().requires_grad_(True) for t in leaves]
    want = mlp(*leaves)
    want.square().sum().backward()
    got = torch.compile(mlp, fullgraph=True, backend="aot_eager")(*twins)
    got.square().sum().backward()
    _assert_no_graph_break()
    assert_close(got, want.detach(), name="out")
    for i, (a, b) in enumerate(zip(twins, leaves)):
        assert_close(a.grad, b.grad, name=f"grad {i}")
