"""The C++ extension (csrc/), in two halves that build, load and fail independently:

  cpu half  -- csrc/bindings.cpp + csrc/cpu/*.cpp: the cpu backend and the CPU buffer cache;
  cuda half -- csrc/bindings.cpp with -DFASTENC_WITH_CUDA + csrc/<op>/*.cpp + csrc/<op>/*.cu: the cuda backend (only
               when torch has CUDA and nvcc exists).
bindings.cpp holds the module definition and the buffer cache; each op's wrappers live with the op and register
themselves (csrc/cpu/<op>_bind.cpp, csrc/<op>/<op>_bind.cpp): a new op's files join by the globs of sources().

Each half is loaded at its first use, never at import, in this order:
  1. an ahead-of-time build (`fastenc._C` / `fastenc._C_cuda`, FASTENC_BUILD_EXT=1 pip install ...), if its recorded
     build metadata matches this torch; a mismatch is reported, not crashed on;
  2. a JIT build with ninja (jit_build) in $FASTENC_EXT_DIR/<half>-<key> (default under
     ~/.cache/fastenc/ext-<torch version>-<hash>/), key = build_key: a digest of the sources' content and the flags,
     so two fastenc checkouts or versions keep their own builds; a process needing a folder another is building
     waits for its flock; "building the C++ extension" is printed only when no complete build of the key exists.
A failed half makes its own backend unavailable with the compiler's message; the other half and the other
backends go on.
"""
from __future__ import annotations

import glob
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import torch

_LOCK = threading.Lock()
_MAX_ERR = 2000
HALVES = ("cpu", "cuda")


class _Half:
    """One module of the extension: the module once loaded, else why it cannot load; its build metadata."""

    __slots__ = ("kind", "module", "error", "meta", "arch_error")

    def __init__(self, kind: str):
        self.kind = kind
        self.module = None
        self.error: str | None = None
        self.meta: dict | None = None
        self.arch_error: str | None = None  # cuda half: why this GPU cannot run what was built (None: it can)


_CPU = _Half("cpu")
_CUDA = _Half("cuda")
_HALF = {"cpu": _CPU, "cuda": _CUDA}


def _half(kind: str) -> _Half:
    try:
        return _HALF[kind]
    except KeyError:
        raise ValueError(f"extension: half must be one of {list(HALVES)}, got {kind!r}") from None


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


def sources(kind: str = "cpu", root: Path | None = None) -> list[str]:
    """The sources of one half under `root` (default csrc_dir()): bindings.cpp plus csrc/cpu/*.cpp (cpu), or
    bindings.cpp, the op folders' csrc/<op>/*.cpp (their bindings) and csrc/<op>/*.cu (cuda)."""
    _half(kind)
    root = Path(root) if root is not None else csrc_dir()
    if kind == "cpu":
        return [str(root / "bindings.cpp")] + sorted(glob.glob(str(root / "cpu" / "*.cpp")))
    ops = [d for d in sorted(root.iterdir()) if d.is_dir() and d.name != "cpu"]
    return ([str(root / "bindings.cpp")] + sorted(str(f) for d in ops for f in d.glob("*.cpp"))
            + sorted(str(f) for d in ops for f in d.glob("*.cu")))


def define_flags(kind: str) -> list[str]:
    """The define that selects bindings.cpp's section for a half (the cuda bindings require it)."""
    return ["-DFASTENC_WITH_CUDA"] if _half(kind).kind == "cuda" else []


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
    key = hashlib.sha1(("%s|%s" % (torch.__version__, sys.version)).encode()).hexdigest()[:10]  # halves: subfolders
    d = Path(base) if base else Path.home() / ".cache" / "fastenc" / f"ext-{torch.__version__.replace('+', '_')}-{key}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def build_key(kind: str, root: Path | None = None) -> str:
    """The cache key of a JIT build of one half: build_stamp of the sources under `root` (default csrc_dir()) with
    the flags this process builds with (cflags, the half's define, nvcc_flags for cuda)."""
    return build_stamp(kind, cflags() + define_flags(kind) + (nvcc_flags() if kind == "cuda" else []), root)


def half_dir(kind: str, key: str | None = None) -> Path:
    """The JIT build folder of one half: build_dir()/<kind>-<first 16 hex digits of key (default build_key)>."""
    d = build_dir() / f"{_half(kind).kind}-{(key or build_key(kind))[:16]}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def lock_file(kind: str, key: str | None = None) -> Path:
    """The flock file guarding half_dir(kind, key), beside it: build_dir()/.<kind>-<key>.build.lock."""
    return build_dir() / f".{_half(kind).kind}-{(key or build_key(kind))[:16]}.build.lock"


# ---------------------------------------------------------------- build metadata
# Every build records {torch, cuda, archs} next to its binary (JIT: build_meta.json in the half's build folder;
# ahead of time: _C.build_meta.json / _C_cuda.build_meta.json beside fastenc/_C*.so, written by setup.py). On load
# a mismatch with the running torch makes the build unusable with the reason; a GPU none of the archs can run
# makes only the cuda backend unavailable, with the reason.
META_FILE = "build_meta.json"
STAMP_FILE = "build_stamp"
AOT_MODULES = {"cpu": "fastenc._C", "cuda": "fastenc._C_cuda"}
AOT_META_FILE = "_C.build_meta.json"


def aot_meta_file(kind: str) -> str:
    """Name of the metadata file setup.py writes beside an ahead-of-time half: _C.build_meta.json, ..."""
    return AOT_MODULES[_half(kind).kind].rpartition(".")[2] + ".build_meta.json"


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


def meta(kind: str = "cpu") -> dict | None:
    """Build metadata of a loaded half (None before it is loaded or when none was recorded)."""
    return _half(kind).meta


def _aot_module(kind: str):
    """(module, None) for a usable ahead-of-time build of the half, (None, why not) for an unusable one,
    (None, None) when there is none."""
    name = AOT_MODULES[kind]
    try:
        mod = importlib.import_module(name)
    except ImportError:
        return None, None
    built = getattr(mod, "torch_version", lambda: "?")()
    if built != torch.__version__.split("+")[0]:
        return None, f"prebuilt {name} was built for torch {built}, running torch {torch.__version__}"
    info = _read_meta(Path(mod.__file__).with_name(aot_meta_file(kind)))
    why = meta_mismatch(info)
    if why:
        return None, f"prebuilt {name} {why}"
    _half(kind).meta = info
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


def build_stamp(kind: str, flags: list[str], root: Path | None = None) -> str:
    """Digest of what a JIT build of the half compiles: the content of its sources and the headers they can
    include (under `root`, default csrc_dir(), by relative path: two identical copies give one digest), the flags,
    torch, Python and the compiler named by CXX."""
    root = Path(root) if root is not None else csrc_dir()
    if kind == "cpu":
        files = [root / "bindings.cpp", *root.glob("cpu/*"), *root.glob("common/*")]
    else:
        files = [f for f in root.rglob("*") if f.is_file()]
    h = hashlib.sha1(repr((torch.__version__, sys.version, flags, os.environ.get("CXX", ""))).encode())
    for f in sorted(set(files)):
        if f.is_file():
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def ninja_up_to_date(d: Path) -> bool:
    """True when ninja, asked for a dry run of folder d's build.ninja, has nothing to do."""
    ninja = shutil.which("ninja")
    if ninja is None or not (d / "build.ninja").is_file():
        return False
    try:
        p = subprocess.run([ninja, "-n", "-C", str(d)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return p.returncode == 0 and "no work to do" in p.stdout


def is_cached(d: Path, name: str, stamp: str) -> bool:
    """True when folder d holds the built module `name`, made from sources and flags with this `stamp`, and ninja
    finds nothing to rebuild (then loading it compiles nothing)."""
    try:
        if not (d / f"{name}.so").is_file() or (d / STAMP_FILE).read_text().strip() != stamp:
            return False
    except OSError:
        return False
    return ninja_up_to_date(d)


BATON = "lock"  # the file torch.utils.cpp_extension.load creates in the build folder while it builds


@contextmanager
def build_lock(kind: str, key: str | None = None):
    """Hold an exclusive flock on lock_file(kind, key) while one half builds or loads its JIT build in
    half_dir(kind, key): another process needing that build waits here until this one is done. torch's own guard,
    a file (BATON) its builder deletes when done, is left by a killed build and would block later builds forever;
    the kernel drops a flock when its process dies, so a baton found under this lock is stale and removed (with a
    message). The lock file lives beside the half's folder, which a stale build's cleanup empties. Without fcntl
    (not POSIX) this only yields."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(lock_file(kind, key), "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            baton = half_dir(kind, key) / BATON
            if baton.exists():
                print(f"fastenc: removing {baton}, left by a build that did not finish", file=sys.stderr, flush=True)
                baton.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def jit_build(kind: str, verbose: bool | None = None, root: Path | None = None):
    """Build (or load the cached build of) one half from the sources under `root` (default csrc_dir()) with ninja,
    under build_lock, and import it; RuntimeError with the compiler's message."""
    root = Path(root) if root is not None else csrc_dir()
    stamp = build_key(kind, root)
    with build_lock(kind, stamp):
        return _jit_build_locked(kind, verbose, stamp, root)


def _jit_build_locked(kind: str, verbose: bool | None, stamp: str, root: Path):
    from torch.utils.cpp_extension import load as _load

    cuda = kind == "cuda"
    d = half_dir(kind, stamp)
    _clear_stale_build(d)
    srcs = sources(kind, root)
    name = f"fastenc_ext_{kind}"
    flags = cflags() + define_flags(kind)
    cuda_flags = nvcc_flags() if cuda else None
    cached = is_cached(d, name, stamp)
    if not cached:
        what = "cuda for " + ", ".join(f"sm_{a}" for a in cuda_archs()) if cuda else "cpu"
        print(f"fastenc: building the C++ extension ({what}, {len(srcs)} sources) in {d} ...",
              file=sys.stderr, flush=True)
    try:
        mod = _load(
            name=name,
            sources=srcs,
            extra_cflags=flags,
            extra_cuda_cflags=cuda_flags,
            extra_ldflags=["-fopenmp"],
            extra_include_paths=[str(root / "common"), str(root)],
            build_directory=str(d),
            verbose=bool(verbose) if verbose is not None else os.environ.get("FASTENC_VERBOSE_BUILD") == "1",
        )
    except Exception as e:  # the compiler's message becomes the backend's reason
        msg = str(e).strip()
        errors = [ln for ln in msg.splitlines() if "error" in ln.lower()]
        msg = "\n".join(errors[:5]) if errors else msg
        raise RuntimeError(f"C++ extension build failed ({kind} half): " + msg[:_MAX_ERR]) from None
    _half(kind).meta = build_meta(cuda)
    try:
        (d / META_FILE).write_text(json.dumps(_half(kind).meta, indent=1) + "\n")
        (d / STAMP_FILE).write_text(stamp + "\n")
    except OSError:
        pass
    if not cached:
        print(f"fastenc: C++ extension ready ({kind})", file=sys.stderr, flush=True)
    return mod


def _load_half(h: _Half, verbose: bool | None):
    if h.module is not None:
        return h.module
    if h.error is not None:
        raise RuntimeError(h.error)
    with _LOCK:
        if h.module is None and h.error is None:
            try:
                h.module = _find_or_build(h.kind, verbose)
            except RuntimeError as e:
                h.error = str(e)
            else:
                if h.kind == "cuda" and h.meta and h.meta.get("archs") and torch.cuda.is_available():
                    h.arch_error = arch_mismatch(list(h.meta["archs"]), torch.cuda.get_device_capability())
        if h.module is None:
            raise RuntimeError(h.error)
        return h.module


def _find_or_build(kind: str, verbose: bool | None):
    mod, why = _aot_module(kind)
    if mod is not None:
        return mod
    note = f"; {why}" if why else ""
    if kind == "cuda" and not with_cuda():
        raise RuntimeError("torch has no CUDA, nvcc is missing or FASTENC_NO_CUDA_EXT is set" + note)
    missing = _compiler_missing()
    if missing:
        raise RuntimeError(missing + note)
    return jit_build(kind, verbose)


def load(verbose: bool | None = None):
    """The cpu half (CPU kernels, buffer cache), built on first use. Raises RuntimeError with the reason."""
    return _CPU.module or _load_half(_CPU, verbose)


def load_cuda(verbose: bool | None = None):
    """The cuda half (CUDA kernels), built on first use. Raises RuntimeError with the reason."""
    return _CUDA.module or _load_half(_CUDA, verbose)


def loaded(kind: str = "cpu") -> bool:
    return _half(kind).module is not None


def status(kind: str = "cpu") -> str | None:
    """Cheap (builds nothing): None if the half is loaded and usable or could be built, else the reason not."""
    h = _half(kind)
    if h.module is not None:
        return h.arch_error
    if h.error is not None:
        return h.error
    if kind == "cuda" and not with_cuda():
        return "torch has no CUDA, nvcc is missing or FASTENC_NO_CUDA_EXT is set"
    return _compiler_missing()


def state(kind: str) -> str:
    """One line on a half for `fastenc info`: loaded (and what for), not built yet, or unavailable and why."""
    h = _half(kind)
    if h.module is not None:
        m = h.meta or {}
        detail = ", ".join(f"{k} {v}" for k, v in m.items() if k in ("torch", "cuda", "archs") and v)
        return ("loaded" + (f" (built for {detail})" if detail else "")
                + (f"; unusable on this GPU: {h.arch_error}" if h.arch_error else ""))
    why = status(kind)
    if why:
        return "unavailable: " + " / ".join(ln.strip() for ln in why.splitlines() if ln.strip())
    return f"not built yet: builds on first use of a {kind} op (or `fastenc build`)"


def cpu_available() -> str | None:
    """Availability for the cpu backend at dispatch: builds the cpu half on first use."""
    if _CPU.module is not None:
        return None
    try:
        _load_half(_CPU, None)
    except RuntimeError as e:
        return str(e)
    return None


def cuda_available() -> str | None:
    """Availability for the cuda backend at dispatch: builds the cuda half on first use."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if _CUDA.module is None:
        try:
            _load_half(_CUDA, None)
        except RuntimeError as e:
            return str(e)
    return _CUDA.arch_error


# ---------------------------------------------------------------- CPU buffer cache
# The CPU kernels' large outputs come from a caching allocator in the extension (csrc/cpu/buffer_cache.h), and so
# do fastenc.layers.Linear's on CPU: a forward's repeated buffer sizes are reused across layers and calls instead of
# being faulted in afresh each time. FASTENC_CPU_CACHE=0 turns it off.

def buffer_empty(shape, like: torch.Tensor) -> torch.Tensor | None:
    """An uninitialized CPU tensor of `shape` with like's dtype from the cache; None when the extension is not
    loaded (nothing is built for it), the cache is off, or while torch.compile traces."""
    mod = _CPU.module
    if mod is None or torch.compiler.is_compiling() or not mod.buffer_cache_enabled():
        return None
    return mod.buffer_empty(list(shape), like)


def empty_cache() -> None:
    """Free the cached (not in use) CPU buffers; tensors still alive keep theirs until they are freed."""
    if _CPU.module is not None:
        _CPU.module.buffer_cache_release()


def buffer_cache_stats() -> dict:
    """Bytes in use and cached, peak bytes in use, hits and misses of the CPU buffer cache (zeros before load)."""
    keys = ("in_use_bytes", "cached_bytes", "peak_in_use_bytes", "hits", "misses")
    if _CPU.module is None:
        return dict.fromkeys(keys, 0)
    return dict(zip(keys, _CPU.module.buffer_cache_stats()))


def set_buffer_cache(enabled: bool) -> None:
    """Turn the CPU buffer cache on or off (off frees what it holds); builds the extension if needed."""
    load().set_buffer_cache(bool(enabled))
