"""`fastenc bench serve` end to end on a tiny budget: two server children, the in-process baseline, the overload
phase; the JSON holds every level's figures, the outputs' agreement and the ratios."""
import json

import pytest

pytest.importorskip("fastapi")


def test_bench_serve_quick(tmp_path):
    from fastenc import cli
    rc = cli.main(["bench", "serve", "--concurrency", "1,4", "--requests", "12", "--time-cap", "20",
                   "--overload-seconds", "2", "--texts-per-request", "2", "--infinity", "/nonexistent",
                   "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "serve.json").read_text())
    assert data["suite"] == "serve" and data["in_process"]["job_texts_per_s"] > 0
    for key in ("fastenc", "fastenc-limited"):
        row = data["providers"][key]
        assert row["cosine_min"] >= 0.99999 and row["exit_code"] == 0
    levels = data["providers"]["fastenc"]["levels"]
    assert [r["concurrency"] for r in levels] == [1, 4]
    assert all(r["statuses"] == {"200": r["ok"]} and r["ok"] >= 12 for r in levels)
    over = data["providers"]["fastenc-limited"]["overload"]
    assert set(over["statuses"]) <= {"200", "429"} and "429" in over["statuses"]
    assert "skipped" in data["providers"]["infinity"]
    assert data["ratios"]["fastenc_c4_vs_in_process_job"] > 0
    lat = data["providers"]["fastenc"]["latency_1x16"]
    assert lat["ok"] == lat["rounds"] and lat["in_process_p50_ms"] > 0
    assert "levels" not in data["providers"]["fastenc-limited"]  # the limited server runs the overload phase
    assert (tmp_path / "serve_latency.png").stat().st_size > 0
