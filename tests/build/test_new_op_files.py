"""Adding an op is adding its own files: a copy of the project with a toy elementwise op, toy_scale(x, s) = x * s,
in only its new files (reference, op module with a reference and a cpu implementation, the cpu kernel with its
registration, its test samples and its benchmark spec) plus one line in each package's exports. In that copy
`fastenc info` lists both implementations, the generic op tests (properties, opcheck) run it on both, `fastenc bench
kernels` measures it, the GPU check's case list holds it, and the built cpu module has toy_scale beside every op of
the real one. One full build of the cpu half."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from fastenc import extension
from fastenc.testing import assert_close, randn

ROOT = Path(__file__).resolve().parents[2]

NEW_FILES = {
    "csrc/cpu/toy_scale.cpp": r"""// toy_scale(x, s) = x * s, fp32 math, the result in x's dtype.
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
""",
    "fastenc/reference/toy_scale.py": '''"""toy_scale reference: x * s."""
import torch


def toy_scale_ref(x: torch.Tensor, s: float, upcast: bool = True) -> torch.Tensor:
    t = x.float() if upcast else x
    return (t * s).to(x.dtype)
''',
    "fastenc/ops/toy_scale.py": '''"""fastenc.ops.toy_scale: x * s, fp32 math."""
from __future__ import annotations

import torch

from fastenc import registry
from fastenc.ops import _backends
from fastenc.ops._common import check_float
from fastenc.ops._library import custom_op
from fastenc.reference.toy_scale import toy_scale_ref

OP = "toy_scale"


@custom_op("fastenc::toy_scale", mutates_args=())
def _toy_scale_op(x: torch.Tensor, s: float, backend: str) -> torch.Tensor:
    return registry.impl(OP, backend).fn(x, s)


@_toy_scale_op.register_fake
def _(x, s, backend):
    return torch.empty_like(x)


_backends.implement(OP, "reference", toy_scale_ref)
_backends.implement(OP, "cpu", "toy_scale")


def toy_scale(x: torch.Tensor, s: float, *, backend: str | None = None) -> torch.Tensor:
    check_float("x", OP, x)
    impl = registry.select(OP, {"x": x, "s": s}, backend)
    return _toy_scale_op(x, float(s), impl.backend)
''',
    "tests/ops/op_samples/toy_scale.py": '''"""toy_scale samples: drawn shapes, dtypes, layouts and scales."""
from hypothesis import strategies as st

from fastenc import ops, testing
from fastenc.reference.toy_scale import toy_scale_ref
from op_samples._draw import HIDDEN, Data, is_small, lead_dims, lowp_or_none

OP = "toy_scale"


def case(draw, backend):
    d = Data(draw, backend)
    dtype = d.dtype(OP)
    x = d.randn(*lead_dims(d, is_small(d)), draw(st.sampled_from(HIDDEN), label="N"), dtype=dtype)
    s = draw(st.floats(-4.0, 4.0, allow_nan=False), label="s")
    got = ops.toy_scale(d.place(x, "x"), s, backend=backend)
    lowp = lowp_or_none(dtype, lambda: toy_scale_ref(x, s, upcast=False))
    testing.assert_close(got, toy_scale_ref(x, s).float(), lowp, dtype=dtype)


def opcheck_samples():
    return {"toy_scale": [dict(x=testing.randn(5, 33), s=1.5)]}
''',
    "fastenc/benchmark/ops/toy_scale.py": '''"""toy_scale benchmark spec: x in, y out."""
import fastenc
from fastenc import reference
from fastenc.benchmark.ops._common import MEMORY, Case, OpInputs, rand

OP, ORDER, BOUND = "toy_scale", 1000, MEMORY


def cases():
    return [Case(OP, "toy 2x8 n16", "toy", [8, 8], {"n": 16}, quick=True)]


def sweep(seq):
    return []


def work(case, e):
    return 2 * case.tokens * case.dims["n"] * e, case.tokens * case.dims["n"]


def setup(case, dev, dtype, g, seed):
    x = rand(case.tokens, case.dims["n"], device=dev, dtype=dtype, gen=g)
    return OpInputs(lambda be: (lambda: fastenc.ops.toy_scale(x, 2.0, backend=be)), {"x": x, "s": 2.0},
                    {"torch-eager": lambda: x * 2.0}, (reference.toy_scale_ref, x, 2.0))
''',
}
EXPORTS = {  # the package exports: one line each
    "fastenc/ops/__init__.py": "from fastenc.ops.toy_scale import toy_scale\n__all__.append('toy_scale')\n",
    "fastenc/reference/__init__.py": "from fastenc.reference.toy_scale import toy_scale_ref\n"
                                     "__all__.append('toy_scale_ref')\n",
}


def _copy_project(dst: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\n")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file() and not rel.startswith("bench/results/"):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)


def test_an_op_is_its_own_files(tmp_path, monkeypatch):
    tree = tmp_path / "project"
    _copy_project(tree)
    for rel, text in NEW_FILES.items():
        assert not (tree / rel).exists(), rel
        (tree / rel).write_text(text)
    for rel, line in EXPORTS.items():
        with open(tree / rel, "a") as f:
            f.write(line)
    ext_dir = tmp_path / "ext"
    env = dict(os.environ, PYTHONPATH=str(tree), FASTENC_EXT_DIR=str(ext_dir), FASTENC_BACKEND="")
    env.pop("TRITON_INTERPRET", None)

    def run(*argv, timeout=1500):
        r = subprocess.run([sys.executable, *argv], cwd=tree, env=env, capture_output=True, text=True,
                           timeout=timeout)
        assert r.returncode == 0, (argv, r.stdout[-3000:], r.stderr[-3000:])
        return r.stdout

    # the op tests on both implementations (the first cpu call builds the copy's cpu half)
    out = run("-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/ops/test_properties.py",
              "tests/ops/test_opcheck.py", "-k", "toy_scale")
    assert re.search(r"\b(\d+) passed", out) and int(re.search(r"\b(\d+) passed", out).group(1)) >= 3, out
    assert " failed" not in out and "skipped" not in out, out
    info = run("-m", "fastenc", "info")
    assert re.search(r"^toy_scale\s+reference\s+available", info, re.M), info
    assert re.search(r"^toy_scale\s+cpu\s+available", info, re.M), info
    bench = run("-m", "fastenc", "bench", "kernels", "--quick", "--device", "cpu", "--ops", "toy_scale",
                "--no-compile", "--no-plots", "--out", str(tmp_path / "bench"))
    assert "toy_scale" in bench and "fastenc-cpu" in bench, bench
    gpu_cases = run("-c", "from fastenc.benchmark import kernels; print(sorted({c.op for c in kernels.cases(quick=True)}))")
    assert "'toy_scale'" in gpu_cases, gpu_cases

    # the copy's cpu module: every op of the real one and toy_scale (the build above, found by its key)
    monkeypatch.setenv("FASTENC_EXT_DIR", str(ext_dir))
    root = tree / "csrc"
    assert str(root / "cpu" / "toy_scale.cpp") in extension.sources("cpu", root)
    assert extension.build_key("cpu", root) != extension.build_key("cpu")  # a new build, not the cached one
    mod = extension.jit_build("cpu", root=root)
    names = {n for n in dir(mod) if not n.startswith("_")}
    real = {n for n in dir(extension.load()) if not n.startswith("_")}
    assert names == real | {"toy_scale"}, names ^ (real | {"toy_scale"})
    assert mod.toy_scale.__doc__.strip().endswith("x * s")
    for shape, dtype in (((37, 129), torch.float32), ((5, 3, 1001), torch.bfloat16)):
        x = randn(*shape, dtype=dtype, seed=7)
        y = mod.toy_scale(x, -1.375)
        assert y.dtype == dtype and y.shape == x.shape
        assert_close(y, x.double() * -1.375, x * -1.375)  # torch's own product in x's dtype
    x = randn(33, 77, seed=8)  # the copy's other ops still work: its gelu matches the real module's
    torch.testing.assert_close(mod.gelu(x, None, "none"), extension.load().gelu(x, None, "none"), rtol=0, atol=0)
