"""`fastenc bench embed` on a tiny corpus: every provider's row, its speed ratio and its output check are filled."""
import pytest

from fastenc.corpus.bench import bench_embed


def test_bench_embed_small(tmp_path):
    res = bench_embed(tmp_path, n=24, rounds=2, memory_sizes=(), ray_actors=(),
                      providers=["fastenc embed", "model.encode", "transformers sdpa"])
    rows = {r["provider"]: r for r in res["payload"]["rows"]}
    assert set(rows) == {"fastenc embed", "fastenc model.encode (batch 32)", "transformers sdpa (same batches)"}
    for r in rows.values():
        assert r["texts"] == 24 and r["tokens"] > 24
        assert len(r["paired_speedups"]) == 2
        assert r["cos_min_vs_fastenc"] == pytest.approx(1.0, abs=1e-5)
    assert rows["fastenc embed"]["fastenc_speedup"] == 1.0
    assert (tmp_path / "embed.json").exists() and (tmp_path / "embed.csv").exists()
