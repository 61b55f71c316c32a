"""The C++ extension's two halves build, load and fail on their own: a CUDA half that fails to build leaves the
cpu backend working and `fastenc info` shows each half's state; a cached build loads without a build message;
setup.py's ahead-of-time build declares the two halves and survives a failing CUDA half."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastenc import cli, extension, ops
from fastenc.reference.layer_norm import layer_norm_ref
from fastenc.testing import assert_close, randn

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh_cuda_half(monkeypatch):
    """The cuda half as if never loaded (restored afterwards)."""
    for attr in ("module", "error", "meta", "arch_error"):
        monkeypatch.setattr(extension._CUDA, attr, None)
    return extension._CUDA


def test_sources_split_by_half():
    cpu, cuda = extension.sources("cpu"), extension.sources("cuda")
    assert Path(cpu[0]).name == Path(cuda[0]).name == "bindings.cpp"
    assert cpu[1:] and all(Path(s).parent.name == "cpu" and s.endswith(".cpp") for s in cpu[1:])
    # the cuda half: each op folder's bindings (host compiler) and kernels (nvcc), never csrc/cpu
    assert {"norm/norm_bind.cpp", "norm/norm.cu", "attention/attention_bind.cpp"} <= {
        Path(s).relative_to(extension.csrc_dir()).as_posix() for s in cuda}
    assert all(Path(s).parent.name not in ("cpu", "common") and s.endswith((".cpp", ".cu")) for s in cuda[1:])
    # the cpu half compiles no CUDA code: bindings.cpp keeps none, and no op's wrappers
    root = extension.csrc_dir()
    text = (root / "bindings.cpp").read_text()
    assert not any(w in text for w in ("cuda_bind.h", "c10/cuda", "fastenc_cuda::"))
    assert set(re.findall(r'm\.def\("(\w+)"', text)) == {
        "torch_version", "has_cuda", "buffer_empty", "buffer_cache_stats", "buffer_cache_release", "set_buffer_cache",
        "buffer_cache_enabled"}
    assert extension.define_flags("cpu") == [] and extension.define_flags("cuda") == ["-DFASTENC_WITH_CUDA"]
    with pytest.raises(ValueError, match="half must be one of \\['cpu', 'cuda'\\], got 'tpu'"):
        extension.sources("tpu")


def test_each_op_registers_its_own_bindings():
    """Every op's wrappers are registered in its own binding file, one FASTENC_BINDINGS block per file; no file
    declares every op's kernels (per-op headers)."""
    root = extension.csrc_dir()
    binds = sorted(root.glob("*/*_bind.cpp"))
    assert {p.relative_to(root).as_posix() for p in binds} >= {"cpu/norm_bind.cpp", "cpu/attention_bind.cpp",
                                                              "norm/norm_bind.cpp", "attention/attention_bind.cpp"}
    for p in binds:
        assert p.read_text().count("FASTENC_BINDINGS(") == 1, p
    assert not (root / "cpu" / "cpu_kernels.h").exists() and not (root / "common" / "cuda_launchers.h").exists()


def test_failing_cuda_half_leaves_cpu_backend(monkeypatch, fresh_cuda_half, capsys):
    import torch.utils.cpp_extension as cpp

    real_load = cpp.load

    def load(name, *args, **kwargs):
        if name == "fastenc_ext_cuda":  # what torch raises when nvcc fails
            raise RuntimeError("Error building extension 'fastenc_ext_cuda': nvcc error: simulated failure")
        return real_load(name, *args, **kwargs)

    monkeypatch.setattr(cpp, "load", load)
    monkeypatch.setattr(extension, "with_cuda", lambda: True)
    monkeypatch.setattr(extension, "nvcc_flags", lambda: ["-O3"])
    with pytest.raises(RuntimeError, match="build failed \\(cuda half\\): .*simulated failure"):
        extension.load_cuda()
    assert "simulated failure" in extension.status("cuda")
    with monkeypatch.context() as m:  # as on a GPU machine: the cuda backend reports its own half's failure
        m.setattr(torch.cuda, "is_available", lambda: True)
        assert "simulated failure" in extension.cuda_available()
    # the cpu half loads (or is already loaded) and serves the cpu backend
    assert extension.cpu_available() is None and extension.status("cpu") is None
    x, w, b = randn(17, 1000, seed=1), randn(1000, seed=2), randn(1000, seed=3)
    y = ops.layer_norm(x, w, b, backend="cpu")
    assert_close(y, layer_norm_ref(x.double(), w.double(), b.double(), 1e-5))
    capsys.readouterr()
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "C++ ext cpu: loaded" in out
    line = next(ln for ln in out.splitlines() if "C++ ext cuda:" in ln)
    assert "unavailable: C++ extension build failed (cuda half)" in line and "simulated failure" in line
    status = {r[1]: " ".join(r[2:]) for r in (ln.split() for ln in out.splitlines() if ln.startswith("layer_norm "))}
    assert status["cpu"].startswith("available")
    assert ("torch has no CUDA" if torch.version.cuda is None else "simulated failure") in status["cuda"]


def test_cached_load_prints_no_build_message():
    """Two processes load the cpu half from one cache folder: the second compiles nothing and says nothing."""
    env = dict(os.environ)
    code = "from fastenc import extension; extension.load(); print('loaded', extension.loaded())"
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1500)
    assert first.returncode == 0 and "loaded True" in first.stdout, first.stderr
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert second.returncode == 0 and "loaded True" in second.stdout, second.stderr
    assert "building the C++ extension" not in second.stderr and "extension ready" not in second.stderr, second.stderr


def test_stale_baton_of_a_killed_build_does_not_hang_the_next_load():
    """A build killed midway leaves torch's baton file in the build folder; the next process still loads the
    (cached) cpu half, removing the baton, instead of waiting for it forever."""
    env = dict(os.environ)
    code = "from fastenc import extension; extension.load(); print('loaded', extension.loaded())"
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1500)
    assert first.returncode == 0 and "loaded True" in first.stdout, first.stderr
    baton = extension.half_dir("cpu") / extension.BATON
    baton.touch()
    try:
        second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    finally:
        baton.unlink(missing_ok=True)
    assert second.returncode == 0 and "loaded True" in second.stdout, second.stderr
    assert "left by a build that did not finish" in second.stderr, second.stderr


def test_build_lock_is_released_when_its_process_dies(tmp_path, monkeypatch):
    """A process killed while it holds the build lock (and torch's baton) blocks nobody: the kernel drops its
    flock, and the next holder removes the baton it left."""
    fcntl = pytest.importorskip("fcntl")
    monkeypatch.setenv("FASTENC_EXT_DIR", str(tmp_path))
    holder = ("import sys, time\nfrom fastenc import extension\n"
              "with extension.build_lock('cpu'):\n"
              "    (extension.half_dir('cpu') / extension.BATON).touch()\n"
              "    print('held', flush=True)\n"
              "    time.sleep(600)\n")
    env = dict(os.environ, FASTENC_EXT_DIR=str(tmp_path))
    p = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "held"
        with open(extension.lock_file("cpu"), "a") as fh:  # held by the live process: a try fails at once
            with pytest.raises(BlockingIOError):
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        p.kill()
        p.wait(timeout=60)
    baton = extension.half_dir("cpu") / extension.BATON
    assert baton.parent.parent == tmp_path
    assert baton.exists()
    with extension.build_lock("cpu"):
        assert not baton.exists()


def test_build_stamp_follows_sources_and_flags(tmp_path, monkeypatch):
    src = tmp_path / "csrc"
    shutil.copytree(extension.csrc_dir(), src)
    monkeypatch.setattr(extension, "csrc_dir", lambda: src)
    cpu, cuda = extension.build_stamp("cpu", ["-O3"]), extension.build_stamp("cuda", ["-O3"])
    d = tmp_path / "build"
    d.mkdir()
    assert not extension.is_cached(d, "m", cpu)  # nothing built yet
    (d / "m.so").write_bytes(b"")
    (d / extension.STAMP_FILE).write_text(cpu + "\n")
    assert not extension.is_cached(d, "m", cpu)  # no build.ninja: ninja cannot say it is up to date
    if shutil.which("ninja") is None:
        pytest.skip("ninja not on PATH")
    (d / "a.c").write_text("int a;\n")
    (d / "build.ninja").write_text("rule cp\n  command = cp $in $out\nbuild a.o: cp a.c\n")
    assert not extension.is_cached(d, "m", cpu)  # a.o is missing: ninja would build
    subprocess.run([shutil.which("ninja"), "-C", str(d)], check=True, capture_output=True)
    assert extension.is_cached(d, "m", cpu)
    later = (d / "a.o").stat().st_mtime + 10
    os.utime(d / "a.c", (later, later))  # a source newer than its object (same content): ninja rebuilds
    assert not extension.is_cached(d, "m", cpu)
    subprocess.run([shutil.which("ninja"), "-C", str(d)], check=True, capture_output=True)
    assert not extension.is_cached(d, "m", extension.build_stamp("cpu", ["-O2"]))  # flags changed
    cu = next(src.glob("*/*.cu"))
    cu.write_text(cu.read_text() + "\n// changed\n")
    assert extension.build_stamp("cpu", ["-O3"]) == cpu  # a .cu file is not part of the cpu half
    assert extension.build_stamp("cuda", ["-O3"]) != cuda
    hdr = next(src.glob("cpu/*.h"))
    hdr.write_text(hdr.read_text() + "\n// changed\n")
    assert not extension.is_cached(d, "m", extension.build_stamp("cpu", ["-O3"]))


def test_build_folder_is_keyed_by_the_sources(tmp_path, monkeypatch):
    """Two copies of the sources with different content build in different folders (and lock different files);
    identical copies anywhere map to the same one. Nothing is compiled."""
    monkeypatch.setenv("FASTENC_EXT_DIR", str(tmp_path / "ext"))
    a, b, same = tmp_path / "a" / "csrc", tmp_path / "b" / "csrc", tmp_path / "c" / "csrc"
    for d in (a, b, same):
        shutil.copytree(extension.csrc_dir(), d)
    f = next(b.glob("cpu/*.cpp"))
    f.write_text(f.read_text() + "\n// another version\n")
    for kind in ("cpu", "cuda"):
        ka, kb, ks = (extension.build_key(kind, d) for d in (a, b, same))
        assert ka == ks and ka != kb
        assert extension.half_dir(kind, ka) == extension.half_dir(kind, ks) != extension.half_dir(kind, kb)
        assert extension.lock_file(kind, ka) != extension.lock_file(kind, kb)
        assert extension.half_dir(kind, ka).parent == tmp_path / "ext"
    assert extension.half_dir("cpu", ka) != extension.half_dir("cuda", ka)
    monkeypatch.setattr(extension, "cflags", lambda aot=False: ["-O2"])  # other flags: another folder
    assert extension.build_key("cpu", a) != ka
    monkeypatch.undo()
    monkeypatch.setenv("FASTENC_EXT_DIR", str(tmp_path / "ext"))
    monkeypatch.setattr(extension, "csrc_dir", lambda: a)  # the default key is that of this checkout's sources
    assert extension.half_dir("cpu") == extension.half_dir("cpu", extension.build_key("cpu", a))


def test_a_build_in_progress_is_waited_for(tmp_path, monkeypatch):
    """A process needing a build folder that another is building waits for the other's flock (it never loads a
    half-built module): here the holder sleeps, and the waiter enters only after it released."""
    pytest.importorskip("fcntl")
    monkeypatch.setenv("FASTENC_EXT_DIR", str(tmp_path))
    holder = ("import time\nfrom fastenc import extension\n"
              "with extension.build_lock('cpu'):\n"
              "    print('held', flush=True)\n"
              "    time.sleep(2)\n"
              "    (extension.half_dir('cpu') / 'done').touch()\n")
    p = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, FASTENC_EXT_DIR=str(tmp_path)))
    try:
        assert p.stdout.readline().strip() == "held"
        with extension.build_lock("cpu"):
            assert (extension.half_dir("cpu") / "done").exists()
    finally:
        p.kill()
        p.wait(timeout=60)


def _setup_module():
    spec = importlib.util.spec_from_file_location("_fastenc_setup", ROOT / "setup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # not __main__: setup() is not run
    return mod


def test_setup_declares_two_extensions(monkeypatch):
    import torch.utils.cpp_extension as cpp

    setup_py = _setup_module()
    cpu_only = setup_py.extensions(cuda=False)
    assert [e.name for e in cpu_only] == ["fastenc._C"]
    if cpp.CUDA_HOME is None:  # CUDAExtension only joins paths under it; nothing is compiled here
        monkeypatch.setattr(cpp, "CUDA_HOME", "/usr/local/cuda")
    cpu, cuda = setup_py.extensions(cuda=True)
    assert (cpu.name, cuda.name) == ("fastenc._C", "fastenc._C_cuda")
    assert not any(s.endswith(".cu") for s in cpu.sources) and "csrc/bindings.cpp" in cpu.sources
    assert not any(s.startswith("csrc/cpu/") for s in cuda.sources) and cuda.sources[0] == "csrc/bindings.cpp"
    assert "csrc/norm/norm_bind.cpp" in cuda.sources and "csrc/norm/norm.cu" in cuda.sources
    assert all(s.endswith((".cpp", ".cu")) and s.count("/") == 2 for s in cuda.sources[1:])
    assert "-DFASTENC_WITH_CUDA" in cuda.extra_compile_args["cxx"]
    assert "-DFASTENC_WITH_CUDA" not in cpu.extra_compile_args["cxx"]


def test_setup_build_goes_on_without_a_failing_cuda_half(tmp_path, monkeypatch):
    from setuptools import Distribution, Extension
    from setuptools.errors import CompileError
    from torch.utils.cpp_extension import BuildExtension

    setup_py = _setup_module()
    built = []

    def fake_build(self, ext):
        built.append((ext.name, self.build_temp))
        if ext.name.endswith("_cuda"):
            raise CompileError("nvcc failed with exit status 1")
        Path(self.get_ext_fullpath(ext.name)).parent.mkdir(parents=True, exist_ok=True)
        Path(self.get_ext_fullpath(ext.name)).write_bytes(b"")

    monkeypatch.setattr(BuildExtension, "build_extension", fake_build, raising=False)
    exts = [Extension("fastenc._C", ["csrc/bindings.cpp"]), Extension("fastenc._C_cuda", ["csrc/bindings.cpp"])]
    cmd = setup_py.build_ext_class()(Distribution({"name": "fastenc", "ext_modules": exts}))
    cmd.build_lib, cmd.build_temp = str(tmp_path / "lib"), str(tmp_path / "temp")
    cmd.ensure_finalized()
    for ext in exts:
        cmd.build_extension(ext)
    assert [b[0] for b in built] == ["fastenc._C", "fastenc._C_cuda"]
    assert built[0][1] != built[1][1]  # each half compiles bindings.cpp in its own folder
    assert set(cmd.failed) == {"fastenc._C_cuda"}
    outputs = cmd.get_outputs()
    assert cmd.get_ext_fullpath("fastenc._C") in outputs and cmd.get_ext_fullpath("fastenc._C_cuda") not in outputs
    meta = tmp_path / "lib" / "fastenc" / "_C.build_meta.json"
    assert meta.is_file() and str(meta) in outputs and not (meta.parent / "_C_cuda.build_meta.json").exists()
    # a failing cpu half still fails the build
    monkeypatch.setattr(BuildExtension, "build_extension", lambda self, ext: (_ for _ in ()).throw(
        CompileError("g++ failed")), raising=False)
    with pytest.raises(CompileError, match="g\\+\\+ failed"):
        cmd.build_extension(exts[0])
