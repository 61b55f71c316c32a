"""A benchmark process the system kills (out of memory, most often) does not end `fastenc bench models` / `bench
train`: the signal is named (fastenc.benchmark.isolated.ChildFailed), the other models still run, the failure is
listed and the exit status is not 0; `bench train` runs the killed model again without torch.compile of
transformers. A child that fails with an error still raises."""
from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from fastenc.benchmark import isolated


def _entry_module(tmp_path, monkeypatch):
    """A module the child can import: die() kills its own process with SIGKILL, fail() raises."""
    (tmp_path / "_bench_child.py").write_text(textwrap.dedent("""
        import os, signal

        def die(spec, send):
            os.kill(os.getpid(), signal.SIGKILL)

        def fail(spec, send):
            raise ValueError("a bad spec")
    """))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_child_killed_is_named(tmp_path, monkeypatch):
    _entry_module(tmp_path, monkeypatch)
    with pytest.raises(isolated.ChildFailed, match=r"m1: benchmark process failed \(killed by SIGKILL") as e:
        isolated.run({"entry": "_bench_child:die", "model": "m1", "threads": 1}, print, lambda: None, print)
    assert e.value.killed and e.value.code == -9
    with pytest.raises(isolated.ChildFailed, match="m2: benchmark process failed .exit code 1.: ValueError: a bad"
                       ) as e:
        isolated.run({"entry": "_bench_child:fail", "model": "m2", "threads": 1}, print, lambda: None, print)
    assert not e.value.killed and e.value.code == 1


def _killed(model):
    return isolated.ChildFailed(model, -9, None)


def test_train_goes_on_after_a_killed_model(tmp_path, monkeypatch):
    from fastenc import cli
    from fastenc.benchmark import train

    calls = []

    def fake_run(spec, log, tick, step):
        calls.append((spec["model"], tuple(spec["providers"])))
        if spec["model"] == "bert-base" and "hf-compile" in spec["providers"]:
            raise _killed("bert-base")
        if spec["model"] == "vit-b16":
            raise _killed("vit-b16")
        return [{"model": spec["model"], "mode": "full", "rows": []}]

    monkeypatch.setattr(train.isolated, "run", fake_run)
    rc = cli.main(["bench", "train", "--quick", "--models", "bert-base,vit-b16,modernbert-base", "--modes", "full",
                   "--providers", "fastenc,hf-sdpa,hf-compile", "--repeats", "1", "--no-plots",
                   "--out", str(tmp_path)])
    assert rc != 0
    assert calls == [("bert-base", ("fastenc", "hf-sdpa", "hf-compile")), ("bert-base", ("fastenc", "hf-sdpa")),
                     ("vit-b16", ("fastenc", "hf-sdpa", "hf-compile")), ("vit-b16", ("fastenc", "hf-sdpa")),
                     ("modernbert-base", ("fastenc", "hf-sdpa", "hf-compile"))]
    data = json.loads((tmp_path / "train.json").read_text())
    assert data["complete"] and [c["model"] for c in data["cases"]] == ["bert-base", "modernbert-base"]
    assert len(data["failures"]) == 3 and "ran again without hf-compile" in data["failures"][0]
    assert all("killed by SIGKILL" in f for f in data["failures"])


def test_train_raises_on_a_failing_model(tmp_path, monkeypatch):
    from fastenc.benchmark import train

    def fake_run(spec, log, tick, step):
        raise isolated.ChildFailed(spec["model"], 1, "KeyError: 'x'")

    monkeypatch.setattr(train.isolated, "run", fake_run)
    with pytest.raises(isolated.ChildFailed, match="KeyError"):
        train.bench_train(quick=True, out=tmp_path, models=["bert-base", "vit-b16"], modes=["full"],
                          providers=["fastenc", "hf-sdpa"], plots=False)


def test_models_go_on_after_a_killed_model(tmp_path, monkeypatch):
    from fastenc import cli
    from fastenc.benchmark import model_suite

    def fake(name, *a, **kw):
        if name == "bert-base":
            raise _killed(name)
        return {"model": name, "rows": [], "latency_rows": [], "breakdown": {}, "skipped": {}, "errors": {},
                "failed": {}, "provider_info": {}, "workloads_not_run": {}}

    monkeypatch.setattr(model_suite, "_run_model_isolated", fake)
    rc = cli.main(["bench", "models", "--quick", "--models", "bert-base,minilm", "--providers", "fastenc,hf-sdpa",
                   "--no-plots", "--out", str(tmp_path)])
    assert rc != 0
    data = json.loads((tmp_path / "models.json").read_text())
    assert [m["model"] for m in data["models"]] == ["bert-base", "minilm"]
    assert len(data["failures"]) == 1 and "killed by SIGKILL" in data["failures"][0]
