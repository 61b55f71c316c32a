"""What the `fastenc bench` subcommands share: the usage error they raise for a bad selection, the dtype names,
the list parsers of comma-separated options, and the options several subcommands declare (each with its own
help text)."""
from __future__ import annotations

import torch

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16,
          "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


class UsageError(ValueError):
    """A bad benchmark selection (--ops, --shapes, --models, --providers, ...): exit code 2 with the message."""


def ints(v: str | None, default: tuple) -> tuple:
    """Comma-separated non-negative integers (zeros dropped: "0" is the empty list), or `default` when None."""
    if v is None:
        return default
    try:
        got = tuple(int(x) for x in v.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"expected comma-separated integers, got {v!r}") from None
    if any(x < 0 for x in got):
        raise SystemExit(f"expected non-negative integers, got {v!r}")
    return tuple(x for x in got if x > 0)


def split(v: str | None) -> list[str] | None:
    return [x.strip() for x in v.split(",") if x.strip()] if v else None


def providers(p, help: str) -> None:
    p.add_argument("--providers", default=None, help=help)


def models(p, help: str) -> None:
    p.add_argument("--models", default=None, help=help)


def no_compile(p) -> None:
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile baselines (they compile for minutes "
                   "on CPU)")


def no_plots(p) -> None:
    p.add_argument("--no-plots", action="store_true", help="write JSON and CSV only")


def same_process(p) -> None:
    p.add_argument("--same-process", action="store_true",
                   help="run every model in this process (default: one fresh process per model when several run)")


def breakdown(p, help: str) -> None:
    p.add_argument("--breakdown", action="store_true", help=help)


def workloads(p, help: str) -> None:
    p.add_argument("--workloads", default=None, help=help)


def quantize(p, help: str) -> None:
    p.add_argument("--quantize", default=None, metavar="MODE", help=help)


def passages(p, help: str) -> None:
    p.add_argument("--passages", type=int, default=None, help=help)
