"""Adding an op's cpu kernel is adding its own file: a copy of csrc/ with one new file, csrc/cpu/toy_scale.cpp
(kernel, torch wrapper and its FASTENC_BINDINGS registration), builds through extension.jit_build with no other
edit, and the module built has toy_scale beside every op of the real one. One full build of the cpu half."""
from __future__ import annotations

import shutil

import torch

from fastenc import extension
from fastenc.testing import assert_close, randn

TOY_SCALE = r"""// toy_scale(x, s) = x * s, fp32 math, the result in x's dtype.
#include <cstdint>

#include "tensor_utils.h"

namespace {

at::Tensor toy_scale(const at::Tensor& x, double s) {
  fastenc_torch::check_cpu(x, "x");
  const at::Tensor xf = fastenc_torch::f32(x);
  at::Tensor y = fastenc_torch::cpu_empty_like(xf);
  const float* px = xf.data_ptr<float>();
  float* py = y.data_ptr<float>();
  for (int64_t i = 0; i < xf.numel(); ++i) py[i] = px[i] * static_cast<float>(s);
  return y.to(x.scalar_type());
}

}  // namespace

FASTENC_BINDINGS(toy_scale) { m.def("toy_scale", &toy_scale, "x * s"); }
"""


def test_a_cpu_op_is_its_own_file(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTENC_EXT_DIR", str(tmp_path / "ext"))
    root = tmp_path / "csrc"
    shutil.copytree(extension.csrc_dir(), root)
    new = root / "cpu" / "toy_scale.cpp"
    new.write_text(TOY_SCALE)
    assert str(new) in extension.sources("cpu", root)
    assert extension.build_key("cpu", root) != extension.build_key("cpu")  # a new build, not the cached one
    mod = extension.jit_build("cpu", root=root)
    ops = {n for n in dir(mod) if not n.startswith("_")}
    real = {n for n in dir(extension.load()) if not n.startswith("_")}
    assert ops == real | {"toy_scale"}, ops ^ (real | {"toy_scale"})
    assert mod.toy_scale.__doc__.strip().endswith("x * s")
    for shape, dtype in (((37, 129), torch.float32), ((5, 3, 1001), torch.bfloat16)):
        x = randn(*shape, dtype=dtype, seed=7)
        y = mod.toy_scale(x, -1.375)
        assert y.dtype == dtype and y.shape == x.shape
        assert_close(y, x.double() * -1.375, x * -1.375)  # torch's own product in x's dtype
    # the copy's other ops still work: its gelu matches the real module's
    x = randn(33, 77, seed=8)
    torch.testing.assert_close(mod.gelu(x, None, "none"), extension.load().gelu(x, None, "none"), rtol=0, atol=0)
