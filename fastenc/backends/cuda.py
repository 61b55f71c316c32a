"""The cuda backend: the CUDA half of the C++ extension (csrc/), built on first use."""
from __future__ import annotations

from fastenc import extension
from fastenc.backends import Backend
from fastenc.backends._extension import extension_fn


def _probe() -> str | None:
    import torch

    if torch.version.cuda is None:
        return "torch has no CUDA"
    return extension.status("cuda")


BACKEND = Backend(name="cuda", order=2, devices=("cuda",), resolve=lambda name: extension_fn(name, "load_cuda"),
                  priority=20, test_devices=("cuda",), available=extension.cuda_available, probe=_probe)
