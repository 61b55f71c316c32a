"""Every csrc/**/*.cu compiles with nvcc for sm_80 and sm_90 (sm_90a too where a file uses wgmma) without
register spills; ptxas's registers / shared memory / spills per kernel are printed as a table at the end.
The cuda half's host sources (csrc/bindings.cpp with FASTENC_WITH_CUDA, each op folder's csrc/<op>/*_bind.cpp) are
syntax-checked against torch's headers. Needs nvcc, not a GPU.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
SOURCES = sorted(p.relative_to(CSRC).as_posix() for p in CSRC.rglob("*.cu"))
ARCHS = ("sm_80", "sm_90")
# torch's extension builds add the __CUDA_NO_HALF*__ defines: the kernels must not lean on implicit conversions.
FLAGS = ["-O3", "--use_fast_math", "-std=c++17", "-DFASTENC_WITH_CUDA", "-D__CUDA_NO_HALF_OPERATORS__",
         "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
         "-Xptxas", "-v"]
TIMEOUT_S = 240


def find_nvcc() -> str | None:
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and (Path(home) / "bin" / "nvcc").exists():
            return str(Path(home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


NVCC = find_nvcc()
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA_HOME, PATH, /usr/local/cuda)")


def archs_for(src: str) -> tuple[str, ...]:
    return ARCHS + (("sm_90a",) if "wgmma" in (CSRC / src).read_text() else ())


@dataclass
class Kernel:
    name: str
    arch: str
    registers: int = 0
    smem: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0


@dataclass
class Result:
    src: str
    arch: str
    returncode: int
    log: str
    kernels: list[Kernel] = field(default_factory=list)


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str) -> list[Kernel]:
    """ptxas -v prints, per entry: 'Compiling entry function', then stack/spill bytes, then 'Used N registers'."""
    kernels: list[Kernel] = []
    cur: Kernel | None = None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            cur = Kernel(m.group(1), m.group(2))
            kernels.append(cur)
            continue
        if cur is None:
            continue
        m = _PROPS.search(line)
        if m:
            cur.stack, cur.spill_stores, cur.spill_loads = (int(g) for g in m.groups())
        m = _USED.search(line)
        if m:
            cur.registers = int(m.group(1))
            s = _SMEM.search(line)
            cur.smem = int(s.group(1)) if s else 0
    return kernels


def gencode(arch: str) -> list[str]:
    num = arch[3:]
    return ["-gencode", f"arch=compute_{num},code=sm_{num}"]


def compile_one(src: str, arch: str, outdir: str) -> Result:
    obj = Path(outdir) / (src.replace("/", "_") + f".{arch}.o")
    cmd = [NVCC, "-c", *FLAGS, *gencode(arch), f"-I{CSRC / 'common'}", f"-I{CSRC}", str(CSRC / src), "-o", str(obj)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
        rc, log = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        rc, log = -1, f"nvcc timed out after {TIMEOUT_S} s"
    return Result(src, arch, rc, log, parse_ptxas(log))


# The cuda half's host-compiled translation units: the module definition and each op folder's bindings.
HOST_SOURCES = ["bindings.cpp"] + sorted(p.relative_to(CSRC).as_posix() for p in CSRC.glob("*/*.cpp")
                                         if p.parent.name != "cpu")


def bindings_syntax_check(src: str) -> Result:
    """g++ -fsyntax-only of one of the cuda half's host sources with FASTENC_WITH_CUDA against torch's (CPU build)
    headers and nvcc's."""
    from torch.utils.cpp_extension import include_paths

    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), str(Path(NVCC).resolve().parents[1]),
             "/usr/local/cuda"]
    cuda_inc = next((Path(h) / "include" for h in homes if h and (Path(h) / "include" / "cuda_runtime.h").exists()),
                    Path("/usr/local/cuda/include"))
    cmd = [os.environ.get("CXX", "g++"), "-std=c++17", "-fsyntax-only", "-w", "-DFASTENC_WITH_CUDA",
           "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE", "-DTORCH_EXTENSION_NAME=fastenc_ext",
           *(f"-I{p}" for p in include_paths()), f"-I{sysconfig.get_paths()['include']}", f"-I{cuda_inc}",
           f"-I{CSRC}", f"-I{CSRC / 'common'}", str(CSRC / src)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
        return Result(src, "host", p.returncode, p.stdout + p.stderr)
    except (subprocess.TimeoutExpired, FileNotFoundError) as e:
        return Result(src, "host", -1, str(e))


def _demangle(names: list[str]) -> dict[str, str]:
    filt = shutil.which("c++filt") or shutil.which("cu++filt")
    if not filt or not names:
        return {n: n for n in names}
    out = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    short = {}
    for n, d in zip(names, out):
        d = d.replace("(anonymous namespace)::", "").replace("fastenc_cuda::", "").replace("attn::", "")
        d = re.sub(r"^void ", "", re.sub(r"\(.*\)$", "", d))  # drop the return type and parameter list
        short[n] = d
    return short


@pytest.fixture(scope="module")
def compiled(write_table):
    """Compile every (source, arch) pair once, two at a time; print the per-kernel table at module teardown."""
    jobs = [(s, a) for s in SOURCES for a in archs_for(s)]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(compile_one, s, a, tmp) for s, a in jobs]
        hosts = [pool.submit(bindings_syntax_check, s) for s in HOST_SOURCES]
        results = {(f.result().src, f.result().arch): f.result() for f in futures + hosts}
    yield results
    kernels = [k for r in results.values() for k in r.kernels]
    names = _demangle(sorted({k.name for k in kernels}))
    lines = ["", "ptxas per kernel (registers / static smem bytes / stack bytes / spill store+load bytes):",
             f"{'arch':<7} {'regs':>4} {'smem':>6} {'stack':>5} {'spill':>5}  kernel"]
    for k in sorted(kernels, key=lambda k: (names[k.name], k.arch)):
        lines.append(f"{k.arch:<7} {k.registers:>4} {k.smem:>6} {k.stack:>5} {k.spill_stores + k.spill_loads:>5}  "
                     f"{names[k.name]}")
    lines.append("(flash_fwd_kernel<T, D> also takes 5 * 64 * (D + 8) * 2 bytes of dynamic shared memory: "
                 "Q, K x2, V x2 tiles)")
    write_table(lines)


def test_sources_found():
    assert {"norm/norm.cu", "act/act.cu", "rope/rope.cu", "lora/merge_lora.cu"} <= set(SOURCES)
    assert any(s.startswith("attention/") for s in SOURCES)


@pytest.mark.parametrize("src", SOURCES)
def test_cu_compiles_without_spills(compiled, src, record_property):
    for arch in archs_for(src):
        r = compiled[(src, arch)]
        assert r.returncode == 0, f"nvcc failed for {src} ({arch}):\n{r.log[-4000:]}"
        assert r.kernels or "__global__" not in (CSRC / src).read_text(), \
            f"{src} ({arch}): no kernel found in the ptxas report:\n{r.log[-2000:]}"
        spills = [k for k in r.kernels if k.spill_stores or k.spill_loads]
        assert not spills, f"{src} ({arch}): register spills in " + ", ".join(
            f"{k.name} ({k.spill_stores} B stores, {k.spill_loads} B loads, {k.registers} registers)" for k in spills)
        for k in r.kernels:
            record_property(f"{arch}:{k.name}", f"regs={k.registers} smem={k.smem} stack={k.stack}")


@pytest.mark.parametrize("src", HOST_SOURCES)
def test_bindings_cuda_half_parses(compiled, src):
    r = compiled[(src, "host")]
    assert r.returncode == 0, f"{src} with FASTENC_WITH_CUDA does not parse:\n{r.log[-4000:]}"


def test_parse_ptxas_reads_spills():
    log = ("ptxas info    : Compiling entry function '_Z1kv' for 'sm_80'\n"
           "ptxas info    : Function properties for _Z1kv\n"
           "    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem, 360 bytes cmem[0]\n")
    (k,) = parse_ptxas(log)
    assert (k.name, k.arch, k.registers, k.smem, k.stack, k.spill_stores, k.spill_loads) == \
        ("_Z1kv", "sm_80", 255, 1024, 24, 8, 12)
