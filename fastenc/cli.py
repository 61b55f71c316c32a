"""`fastenc info | build | run | embed | bench | finetune | serve` — the command line. Bad input ends in a
one-line error on stderr and a non-zero exit, never a traceback."""
from __future__ import annotations

import argparse
import importlib
import platform
import sys


def _versions() -> list[tuple[str, str]]:
    import importlib.metadata as md

    import torch

    def ver(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"

    rows = [("fastenc", ver("fastenc")), ("python", platform.python_version()), ("torch", torch.__version__),
            ("triton", ver("triton")), ("torch CUDA", str(torch.version.cuda)), ("transformers", ver("transformers"))]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            rows.append((f"cuda:{i}", f"{p.name} (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB)"))
    else:
        rows.append(("cuda devices", "none"))
    rows.append(("cpu", f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"))
    return rows


def cmd_info(args) -> int:
    import fastenc  # noqa: F401  (registers every op)
    from fastenc import extension, registry

    if getattr(args, "build", False):
        extension.cpu_available()
        if extension.with_cuda():
            try:
                extension.load_cuda()
            except RuntimeError:
                pass  # its state below says why
    for k, v in _versions():
        print(f"{k:>14}: {v}")
    for kind in extension.HALVES:  # each half of the C++ extension builds, loads and fails on its own
        print(f"{'C++ ext ' + kind:>14}: {extension.state(kind)}")
    print(f"{'int8 GEMM':>14}: {_int8_paths()}")
    rows = registry.info_table()
    w = max(len(r[0]) for r in rows)
    print()
    print(f"{'op':<{w}}  {'backend':<9}  status")
    print(f"{'-' * w}  {'-' * 9}  {'-' * 40}")
    for op, backend, status in rows:
        print(f"{op:<{w}}  {backend:<9}  {status}")
    _print_architectures()
    return 0


def _int8_paths() -> str:
    """The int8 GEMM's instruction-set paths this machine runs, the one taken, and why the others cannot run (only
    once the cpu half is loaded: info builds nothing unless asked to)."""
    from fastenc import extension
    from fastenc.quant import isa

    if not extension.loaded("cpu"):
        return "paths avx2 / avx512_vnni / amx, chosen when the cpu half loads (fastenc info --build)"
    try:
        chosen = isa.chosen()
    except ValueError as e:  # a bad FASTENC_INT8_ISA
        return str(e)
    paths = ", ".join(name if why is None else f"{name}: {why}" for name, why in isa.available().items())
    return f"{chosen} ({paths})"


def _print_architectures() -> None:
    """The architecture table: each model_type, its modality and the transformers classes (heads) it loads."""
    from fastenc.models import architecture

    table = architecture.architectures()
    w = max(12, *(len(a) for a in table))
    print()
    print(f"{'architecture':<{w}}  {'input':<11}  transformers classes (task)")
    print(f"{'-' * w}  {'-' * 11}  {'-' * 40}")
    for name, spec in table.items():
        heads = ", ".join(f"{hf} ({task})" for task, (_, hf) in spec.heads.items())
        enc = f"; encoder of {', '.join(spec.encoder_of)}" if spec.encoder_of else ""
        print(f"{name:<{w}}  {spec.modality:<11}  {heads}{enc}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fastenc", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    pi = sub.add_parser("info", help="versions, devices, and every op x backend with its status")
    pi.add_argument("--build", action="store_true", help="build the C++ extension first and report")
    pi.set_defaults(func=cmd_info)
    pb = sub.add_parser("build", help="build the C++ extension now and report (same as info --build)")
    pb.set_defaults(func=lambda a: (setattr(a, "build", True), cmd_info(a))[1])
    # Subcommands owned by their modules: each module exposes add_parser(subparsers) setting `func`.
    for module in ("fastenc.run", "fastenc.corpus.cli", "fastenc.benchmark.cli", "fastenc.finetune",
                   "fastenc.serve.cli"):
        importlib.import_module(module).add_parser(sub)
    return p


def check_environment() -> str | None:
    """The reason the environment cannot work (a FASTENC_BACKEND naming no backend), else None."""
    from fastenc import registry

    try:
        registry.requested_backends()
    except ValueError as e:
        return str(e)
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    why = check_environment()
    if why:
        print(f"fastenc: {why}", file=sys.stderr)
        return 2
    from fastenc.cli_checks import UsageError

    try:
        return args.func(args)
    except UsageError as e:  # an argument refused by fastenc.cli_checks (before any work)
        print(f"fastenc {args.cmd}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
