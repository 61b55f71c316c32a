"""`fastenc bench embed` on a tiny corpus: every provider's row, its speed ratio and its output check are filled."""
import pytest

from fastenc.benchmark.embed import bench_embed


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


def test_bench_embed_memory_only(tmp_path, monkeypatch):
    """rounds=0 skips the timed providers; the memory rows come from a fresh process embedding a corpus file. The
    passages are read once, as many as the memory corpora need (n is for the timed and Ray rows)."""
    from fastenc.corpus import docstrings

    limits = []
    real = docstrings.docstring_passages
    monkeypatch.setattr(docstrings, "docstring_passages", lambda limit, **kw: limits.append(limit) or real(limit, **kw))
    res = bench_embed(tmp_path, n=8, rounds=0, memory_sizes=(30,), ray_actors=())
    assert limits == [30]
    pay = res["payload"]
    assert pay["rows"] == [] and pay["rounds"] == 0
    for kind in ("same_distribution", "first_n"):
        (size, mem), = pay[f"peak_rss_mib_{kind}"].items()
        assert int(size) == 30 and 0 < mem["model_loaded"] <= mem["peak"]
    assert set(pay["memory_corpora"]) == {"same_distribution", "first_n"}
    bench_embed(tmp_path / "none", n=8, rounds=0, memory_sizes=(), ray_actors=())
    assert limits == [30]  # nothing needed the passages: none read


def test_bench_cli_int_lists():
    from fastenc.benchmark.options import ints as _ints

    assert _ints(None, (1, 2)) == (1, 2)
    assert _ints("0", (1, 2)) == ()
    assert _ints("10000, 40000", ()) == (10000, 40000)
    with pytest.raises(SystemExit, match="integers"):
        _ints("a,b", ())
    with pytest.raises(SystemExit, match="non-negative"):
        _ints("-1", ())


def test_same_distribution_order_is_a_fixed_permutation():
    from fastenc.corpus.docstrings import shuffled

    texts = [f"passage {i}" for i in range(500)]
    a, b = shuffled(texts, 0), shuffled(iter(texts), 0)
    assert a == b and sorted(a) == sorted(texts) and a != texts  # fixed for a seed, nothing lost or repeated
    assert shuffled(texts, 1) != a and texts == [f"passage {i}" for i in range(500)]  # input left as it was


def test_bench_embed_int8_rows(tmp_path):
    """--quantize int8: the int8 job's row beside fastenc fp32 and sentence-transformers, each with its agreement
    with fp32 sentence-transformers (cosine min and mean) and its speed ratio to it, in the JSON and the CSV."""
    import json

    pytest.importorskip("sentence_transformers")
    res = bench_embed(tmp_path, n=16, rounds=1, memory_sizes=(), ray_actors=(), quantize="int8",
                      providers=["fastenc embed", "sentence-transformers"])
    pay = json.loads((tmp_path / "embed.json").read_text())
    assert pay["quantize"]["mode"] == "int8" and pay["quantize"]["layers"] == 24 and pay["quantize"]["int8_path"]
    rows = {r["provider"]: r for r in pay["rows"]}
    assert set(rows) == {"fastenc embed", "fastenc embed int8", "sentence-transformers (batch 32)"}
    st, int8, fp32 = rows["sentence-transformers (batch 32)"], rows["fastenc embed int8"], rows["fastenc embed"]
    assert st["cos_min_vs_sentence_transformers"] == pytest.approx(1.0, abs=1e-6)
    assert fp32["cos_min_vs_sentence_transformers"] > 0.99999
    assert 0.99 < int8["cos_min_vs_sentence_transformers"] <= int8["cos_mean_vs_sentence_transformers"] < 1.0
    for r in rows.values():
        assert r["texts"] == 16 and r["speedup_vs_sentence_transformers"] > 0
        assert len(r["paired_speedups_vs_sentence_transformers"]) == 1
    assert st["paired_speedup_vs_sentence_transformers"] == 1.0
    assert "cos_mean_vs_sentence_transformers" in (tmp_path / "embed.csv").read_text().splitlines()[0]
    assert res["payload"]["rows"] == pay["rows"]


def test_bench_embed_bad_quantize(tmp_path):
    with pytest.raises(ValueError, match="bench_embed: quantize must be one of int8"):
        bench_embed(tmp_path, n=4, rounds=1, memory_sizes=(), ray_actors=(), quantize="int4")
