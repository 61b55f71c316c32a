"""pytest-benchmark: every op of fastenc/benchmark/ops at its spec's cases, every provider (one group per op;
`pytest bench/ -k gelu` keeps one op)."""


def test_kernel(kernel_bench):
    kernel_bench()
