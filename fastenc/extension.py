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
import json
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
    # -fno-trapping-math (as torch builds itself): without it GCC does not if-convert the selects of the GELU
    # and exp loops into blends on AVX2 (AVX-512's masked ops do not need it) and those loops stay scalar.
    # Results do not change: only floating-point exception flags are given up. -fno-math-errno lets sqrt inline.
    flags = ["-O3", "-fopenmp", "-fno-trapping-math", "-fno-math-errno"]
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


# ---------------------------------------------------------------- build metadata
# Every build records {torch, cuda, archs} next to its binary (JIT: build_meta.json in the build folder;
# ahead of time: _C.build_meta.json beside fastenc/_C*.so, written by setup.py). On load a mismatch with the
# running torch makes the build unusable with the reason; a GPU none of the archs can run makes only the cuda
# backend unavailable, with the reason.
META_FILE = "build_meta.json"
AOT_META_FILE = "_C.build_meta.json"
_META: dict | None = None


def build_meta(cuda: bool) -> dict:
    """What a build depends on: torch and CUDA versions, the GPU architectures compiled."""
    return {"torch": torch.__version__, "cuda": torch.version.cuda if cuda else None,
            "archs": cuda_archs() if cuda else [], "with_cuda": bool(cuda), "python": sys.version.split()[0]}


def _read_meta(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def meta_mismatch(meta: dict | None) -> str | None:
    """Why a build with this metadata cannot be used by the running torch (None: it can)."""
    if not meta:
        return None
    if meta.get("torch") != torch.__version__:
        return f"built for torch {meta.get('torch')}, running torch {torch.__version__}"
    if meta.get("with_cuda") and meta.get("cuda") != torch.version.cuda:
        return f"built with CUDA {meta.get('cuda')}, running torch has CUDA {torch.version.cuda}"
    return None


def arch_mismatch(archs: list[str], capability: tuple[int, int]) -> str | None:
    """None if code built for `archs` (e.g. ["80", "90a"]) runs on a GPU of `capability`, else the reason.
    sm_XY machine code runs on X.Z for Z >= Y; an "a" arch (sm_90a) only on exactly that chip."""
    major, minor = capability
    if major < 8:
        return f"the CUDA kernels need sm_80 or newer (bf16 mma.sync, cp.async); this GPU is sm_{major}{minor}"
    for a in archs:
        num = a.rstrip("a")
        if not num.isdigit() or len(num) < 2:
            continue
        amaj, amin = int(num[:-1]), int(num[-1])
        if amaj == major and (amin == minor if a.endswith("a") else amin <= minor):
            return None
    built = ", ".join(f"sm_{a}" for a in archs) or "no GPU architecture"
    return (f"the CUDA kernels were built for {built}; this GPU is sm_{major}{minor} "
            f"(set FASTENC_CUDA_ARCHS to include {major}{minor} and rebuild)")


def meta() -> dict | None:
    """Build metadata of the loaded extension (None before it is loaded or when none was recorded)."""
    return _META


def _aot_module():
    try:
        mod = importlib.import_module("fastenc._C")
    except ImportError:
        return None, None
    built = getattr(mod, "torch_version", lambda: "?")()
    if built != torch.__version__.split("+")[0]:
        return None, f"prebuilt fastenc._C was built for torch {built}, running torch {torch.__version__}"
    info = _read_meta(Path(mod.__file__).with_name(AOT_META_FILE))
    why = meta_mismatch(info)
    if why:
        return None, f"prebuilt fastenc._C {why}"
    global _META
    _META = info
    return mod, None


def _clear_stale_build(d: Path) -> None:
    """A build folder made for another torch/CUDA (a fixed FASTENC_EXT_DIR) is emptied so ninja rebuilds."""
    why = meta_mismatch(_read_meta(d / META_FILE))
    if why is None:
        return
    print(f"fastenc: cached build in {d} was {why}; rebuilding", file=sys.stderr, flush=True)
    for p in d.iterdir():
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


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
    global _MODULE, _ERROR, _META
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
        _clear_stale_build(build_dir())
        what = "cpu+cuda for " + ", ".join(f"sm_{a}" for a in cuda_archs()) if cuda else "cpu"
        print(f"fastenc: building the C++ extension ({what}, {len(srcs)} sources) "
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
        _META = build_meta(cuda)
        try:
            (build_dir() / META_FILE).write_text(json.dumps(_META, indent=1) + "\n")
        except OSError:
            pass
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
    if _META and _META.get("archs"):
        return arch_mismatch(list(_META["archs"]), torch.cuda.get_device_capability())
    return None


# ---------------------------------------------------------------- CPU buffer cache
# The CPU kernels' large outputs come from a caching allocator in the extension (csrc/cpu/buffer_cache.h), and so
# do fastenc.layers.Linear's on CPU: a forward's repeated buffer sizes are reused across layers and calls instead of
# being faulted in afresh each time. FASTENC_CPU_CACHE=0 turns it off.

def buffer_empty(shape, like: torch.Tensor) -> torch.Tensor | None:
    """An uninitialized CPU tensor of `shape` with like's dtype from the cache; None when the extension is not
    loaded (nothing is built for it), the cache is off, or while torch.compile traces."""
    if _MODULE is None or torch.compiler.is_compiling():
        return None
    if not _MODULE.buffer_cache_enabled():
        return None
    return _MODULE.buffer_empty(list(shape), like)


def empty_cache() -> None:
    """Free the cached (not in use) CPU buffers; tensors still alive keep theirs until they are freed."""
    if _MODULE is not None:
        _MODULE.buffer_cache_release()


def buffer_cache_stats() -> dict:
    """Bytes in use and cached, peak bytes in use, hits and misses of the CPU buffer cache (zeros before load)."""
    keys = ("in_use_bytes", "cached_bytes", "peak_in_use_bytes", "hits", "misses")
    if _MODULE is None:
        return dict.fromkeys(keys, 0)
    return dict(zip(keys, _MODULE.buffer_cache_stats()))


def set_buffer_cache(enabled: bool) -> None:
    """Turn the CPU buffer cache on or off (off frees what it holds); builds the extension if needed."""
    load().set_buffer_cache(bool(enabled))
