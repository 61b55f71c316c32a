"""Arguments are checked before any work (fastenc.cli_checks): a bad device, thread count, learning rate or output
folder ends in one line on stderr naming the argument, what it expects and what it got, and exit code 2; an
explicit 0 is refused, never replaced by a default."""
from __future__ import annotations

import pytest
import torch

from fastenc import cli, cli_checks

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


@pytest.fixture
def no_work(monkeypatch):
    """Every command's work fails the test: the checks must refuse first."""
    import fastenc
    import fastenc.benchmark.cli as bench
    import fastenc.corpus as corpus
    import fastenc.finetune as finetune

    def work(*a, **k):
        raise AssertionError("the command started its work before checking its arguments")

    monkeypatch.setattr(fastenc, "from_pretrained", work)
    monkeypatch.setattr(corpus, "embed", work)
    monkeypatch.setattr(bench, "_run_suite", work)
    monkeypatch.setattr(finetune, "finetune", work)


def refused(capsys, argv, *needles):
    rc = cli.main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("argv", [["run", "--no-check", "--bench-size", "0"], ["embed", "in.txt", "--out", "o.npy"],
                                  ["bench", "kernels"]], ids=["run", "embed", "bench"])
def test_bogus_device(argv, capsys, no_work):
    line = refused(capsys, argv + ["--device", "bogus"], "--device", "cpu, cuda or cuda:N", "'bogus'")
    assert line.startswith(f"fastenc {argv[0]}: "), line


@no_cuda
@pytest.mark.parametrize("argv", [["run", "--no-check", "--bench-size", "0"], ["embed", "in.txt", "--out", "o.npy"],
                                  ["bench", "kernels"]], ids=["run", "embed", "bench"])
@pytest.mark.parametrize("dev", ["cuda", "cuda:1"])
def test_cuda_without_cuda(argv, dev, capsys, no_work):
    refused(capsys, argv + ["--device", dev], "--device", repr(dev), "no")


@pytest.mark.parametrize("n", ["0", "-1"])
def test_bench_threads(n, capsys, no_work):
    refused(capsys, ["bench", "kernels", "--device", "cpu", "--threads", n], "--threads", ">= 1", f"got {n}")


@pytest.mark.parametrize("flag", ["--rounds", "--repeats"])
def test_bench_zero_rounds_is_refused(flag, capsys, no_work):
    refused(capsys, ["bench", "models", "--device", "cpu", flag, "0"], flag, ">= 1", "got 0")


@pytest.mark.parametrize("lr", ["0", "-1", "nan", "inf"])
def test_finetune_lr(lr, capsys, no_work, tmp_path):
    refused(capsys, ["finetune", "--tiny", "--out", str(tmp_path / "o"), "--lr", lr], "fastenc finetune:", "--lr",
            "> 0", "got")


def test_finetune_lr_zero_in_the_api():
    from fastenc.finetune import finetune

    with pytest.raises(ValueError, match="lr must be > 0, got 0"):
        finetune(lr=0.0, per_class=1, epochs=1, progress=False, log=lambda *a: None)


@pytest.mark.parametrize("lora", [False, True])
def test_finetune_out_is_a_file(lora, capsys, no_work, tmp_path):
    f = tmp_path / "taken"
    f.write_text("x")
    refused(capsys, ["finetune", "--tiny", "--out", str(f)] + ["--lora"] * lora, "--out", "folder", str(f))
    refused(capsys, ["finetune", "--tiny", "--out", str(f / "sub")], "--out", "under the file", str(f))


def test_validators_directly(tmp_path):
    assert cli_checks.device(None) is None and cli_checks.device("cpu") == torch.device("cpu")
    assert cli_checks.threads(None) is None and cli_checks.threads(3) == 3
    assert cli_checks.positive(1e-5, "--lr") == 1e-5
    assert cli_checks.output_folder(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert cli_checks.output_folder(tmp_path) == tmp_path
    with pytest.raises(cli_checks.UsageError, match=r"--device must be cpu, cuda or cuda:N, got 'meta'"):
        cli_checks.device("meta")




@pytest.mark.parametrize("argv", [["run", "--no-check", "--bench-size", "0"], ["embed", "in.txt", "--out", "o.npy"],
                                  ["serve"]], ids=["run", "embed", "serve"])
@pytest.mark.parametrize("value", ["int4", "fp32"])
def test_bad_quantize(argv, value, capsys, no_work):
    refused(capsys, argv + ["--quantize", value], "--quantize", "int8", repr(value))


@pytest.mark.parametrize("argv,dtype", [(["run", "--no-check", "--bench-size", "0"], "fp16"),
                                        (["embed", "in.txt", "--out", "o.npy"], "bfloat16")], ids=["run", "embed"])
def test_quantize_refuses_other_dtypes(argv, dtype, capsys, no_work):
    refused(capsys, argv + ["--quantize", "int8", "--dtype", dtype], "--quantize int8 runs in float32",
            f"--dtype {dtype}")


@pytest.mark.parametrize("extra,needles", [(["--quantize", "int4"], ["--quantize must be one of int8", "'int4'"]),
                                           (["--quantize", "int8", "--dtype", "bf16"],
                                            ["--quantize int8 runs in float32", "--dtype bfloat16"])],
                         ids=["value", "dtype"])
def test_bench_embed_quantize(extra, needles, capsys, monkeypatch):
    """`fastenc bench embed` checks --quantize in its own command, before the benchmark starts."""
    import fastenc.benchmark.embed as bench_embed

    monkeypatch.setattr(bench_embed, "bench_embed", lambda *a, **k: pytest.fail("the benchmark ran before the check"))
    line = refused(capsys, ["bench", "embed", "--device", "cpu", *extra], *needles)
    assert line.startswith("fastenc bench: "), line
