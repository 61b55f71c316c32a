"""Benchmarks of fastenc's kernels and models against the tools users would pick instead (`fastenc bench`).

timing (CPU monotonic clock / CUDA events, interleaved providers), ceilings (copy bandwidth, GEMM rate),
kernels (op x backend x shapes with bytes/FLOPs models), models (encoders vs transformers and ONNX Runtime),
report (JSON, CSV, PNG, terminal tables), suite (the two suites), cli (`fastenc bench`).
Nothing here is imported by `import fastenc`.
"""
