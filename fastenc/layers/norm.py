"""LayerNorm module over fastenc.ops.layer_norm, with the residual add fused into the same pass."""
from __future__ import annotations

import torch
from torch import nn

from fastenc import ops


class LayerNorm(nn.Module):
    """LayerNorm over the last dim; `bias=False` gives ModernBERT's bias-free LayerNorm (not RMSNorm).

    forward(x) -> y;  forward(x, residual) -> (y, x + residual): y = LN(x + residual), and the sum is the
    new residual stream of a pre-norm block (post-norm blocks just ignore it).
    x, residual: (..., hidden) fp32/fp16/bf16.
    """

    def __init__(self, hidden: int, eps: float = 1e-5, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.hidden, self.eps = hidden, float(eps)
        self.weight = nn.Parameter(torch.ones(hidden, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(hidden, device=device, dtype=dtype)) if bias else None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, *,
                input_bias: torch.Tensor | None = None, return_residual: bool = True, plan=None):
        """input_bias: the bias of the linear that produced x (fused here); return_residual=False: y alone.
        plan: the forward's fastenc.ops.direct.Plan (or None), which runs y alone on the cpu kernel."""
        if plan is not None and (residual is None or not return_residual):
            return plan.layer_norm(self, x, residual, input_bias)
        return ops.layer_norm(x, self.weight, self.bias, self.eps, residual=residual, input_bias=input_bias,
                              return_residual=return_residual)

    def extra_repr(self) -> str:
        return f"{self.hidden}, eps={self.eps}, bias={self.bias is not None}"
