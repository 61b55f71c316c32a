"""The C++ extension (csrc/): CPU kernels always, CUDA kernels when torch has CUDA.

Loaded in this order at first use, never at import:
  1. an ahead-of-time build `fastenc._C` (FASTENC_BUILD_EXT=1 pip install ...), if its recorded build
     metadata matches this torch; a mismatch is reported, not crashed on;
  2. a JIT build with ninja through torch.utils.cpp_extension.load, cached under
     $FASTENC_EXT_DIR (default ~/.cache/fastenc/<torch version>), printing what it builds.
A failed build makes the cpu/cuda backends unavailable with the compiler's message; other backends go on.
"""
from __future__ import annotations

import glob
import hashlib
import importlib
import os
import shutil
import sys
import threading
from pathlib import Path

import torch

_LOCK = threading.Lock()
_MODULE = None
_ERROR: str | None = None
_MAX_ERR = 2000


def csrc_dir() -> Path:
    here = Path(__file__).resolve().parent
    for cand in (here.parent / "csrc", here / "csrc"):
        if (cand / "bindings.cpp").exists():
            return cand
    raise FileNotFoundError("fastenc: csrc/ sources not found next to the package")


def with_cuda() -> bool:
    """Build CUDA sources only when torch has CUDA and nvcc exists (FASTENC_NO_CUDA_EXT=1 disables)."""
    if os.environ.get("FASTENC_NO_CUDA_EXT", "0") not in ("", "0"):
        return False
    if torch.version.cuda is None:
        return False
    from torch.utils.cpp_extension import CUDA_HOME
    return CUDA_HOME is not None


def cuda_archs() -> list[str]:
    archs = os.environ.get("FASTENC_CUDA_ARCHS", "80;90")
    return [a.strip() for a in archs.replace(",", ";").split(";") if a.strip()]


def sources(cuda: bool | None = None) -> list[str]:
    root = csrc_dir()
    srcs = [str(root / "bindings.cpp")] + sorted(glob.glob(str(root / "cpu" / "*.cpp")))
    if with_cuda() if cuda is None else cuda:
        srcs += sorted(glob.glob(str(root / "*" / "*.cu")))
    return srcs


def cflags(aot: bool = False) -> list[str]:
    flags = ["-O3", "-fopenmp"]
    arch = os.environ.get("FASTENC_CPU_ARCH", "" if aot else "native")
    if arch:
        flags.append(f"-march={arch}")
    return flags


def nvcc_flags() -> list[str]:
    flags = ["-O3", "--use_fast_math", "-lineinfo", "-DFASTENC_WITH_CUDA"]
    for a in cuda_archs():
        num = a.rstrip("a")
        flags += ["-gencode", f"arch=compute_{a},code=sm_{a}" if a.endswith("a") else f"arch=compute_{num},code=sm_{num}"]
    return flags


def build_dir() -> Path:
    base = os.environ.get("FASTENC_EXT_DIR")
    key = hashlib.sha1(("%s|%s|%s" % (torch.__version__, sys.version, with_cuda())).encode()).hexdigest()[:10]
    d = Path(base) if base else Path.home() / ".cache" / "fastenc" / f"ext-{torch.__version__.replace('+', '_')}-{key}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _aot_module():
    try:
        mod = importlib.import_module("fastenc._C")
    except ImportError:
        return None, None
    built = getattr(mod, "torch_version", lambda: "?")()
    if built != torch.__version__.split("+")[0]:
        return None, f"prebuilt fastenc._C was built for torch {built}, running torch {torch.__version__}"
    return mod, None


def _compiler_missing() -> str | None:
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None and shutil.which("g++") is None:
        return f"no C++ compiler found ({cxx!r} not on PATH)"
    if shutil.which("ninja") is None:
        try:
            import ninja  # noqa: F401
        except ImportError:
            return "ninja is not installed (pip install ninja)"
    return None


def loaded() -> bool:
    return _MODULE is not None


def status() -> str | None:
    """Cheap: None if the extension is loaded or could be built, else the reason it cannot."""
    if _MODULE is not None:
        return None
    if _ERROR is not None:
        return _ERROR
    return _compiler_missing()


def load(verbose: bool | None = None):
    """Return the extension module, building it on first use. Raises RuntimeError with the reason."""
    global _MODULE, _ERROR
    if _MODULE is not None:
        return _MODULE
    if _ERROR is not None:
        raise RuntimeError(_ERROR)
    with _LOCK:
        if _MODULE is not None:
            return _MODULE
        mod, why = _aot_module()
        if mod is not None:
            _MODULE = mod
            return mod
        missing = _compiler_missing()
        if missing:
            _ERROR = missing + (f"; {why}" if why else "")
            raise RuntimeError(_ERROR)
        from torch.utils.cpp_extension import load as _load
        cuda = with_cuda()
        srcs = sources(cuda)
        print(f"fastenc: building the C++ extension ({'cpu+cuda' if cuda else 'cpu'}, {len(srcs)} sources) "
              f"in {build_dir()} ...", file=sys.stderr, flush=True)
        try:
            _MODULE = _load(
                name="fastenc_ext",
                sources=srcs,
                extra_cflags=cflags() + (["-DFASTENC_WITH_CUDA"] if cuda else []),
                extra_cuda_cflags=nvcc_flags(),
                extra_ldflags=["-fopenmp"],
                extra_include_paths=[str(csrc_dir() / "common"), str(csrc_dir())],
                build_directory=str(build_dir()),
                verbose=bool(verbose) if verbose is not None else os.environ.get("FASTENC_VERBOSE_BUILD") == "1",
            )
        except Exception as e:  # the compiler's message becomes the backend's reason
            msg = str(e).strip()
            errors = [ln for ln in msg.splitlines() if "error" in ln.lower()]
            msg = "\n".join(errors[:5]) if errors else msg
            _ERROR = "C++ extension build failed: " + msg[:_MAX_ERR]
            raise RuntimeError(_ERROR) from None
        print("fastenc: C++ extension ready", file=sys.stderr, flush=True)
        return _MODULE


def cpu_available() -> str | None:
    """Availability for the cpu backend at dispatch: builds the extension on first use."""
    try:
        load()
    except RuntimeError as e:
        return str(e)
    return None


def cuda_available() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    if not with_cuda():
        return "torch has no CUDA or nvcc is missing"
    why = cpu_available()
    if why:
        return why
    if not getattr(_MODULE, "has_cuda", lambda: False)():
        return "extension was built without CUDA kernels"
    return None
