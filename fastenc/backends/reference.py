"""The reference backend: the ops' plain torch code (fastenc/reference), on any device torch runs; the fallback
when no faster backend serves the inputs, and what every other backend is tested against."""
from fastenc.backends import ANY, Backend

BACKEND = Backend(name="reference", order=0, devices=(ANY,), resolve=lambda fn: fn, priority=0,
                  test_devices=("cuda", "cpu"))
