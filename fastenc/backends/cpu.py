"""The cpu backend: the CPU half of the C++ extension (csrc/cpu), built on first use; fp32 math."""
from fastenc import extension
from fastenc.backends import Backend
from fastenc.backends._extension import extension_fn

BACKEND = Backend(name="cpu", order=3, devices=("cpu",), resolve=lambda name: extension_fn(name, "load"),
                  priority=20, test_devices=("cpu",), limits="fp32 math", available=extension.cpu_available,
                  probe=extension.status)
