"""Benchmarks of fastenc's kernels, models, training, corpus job and server against the tools users would pick
instead (`fastenc bench <subcommand>`; nothing here is imported by `import fastenc`).

ops/          one benchmark spec per op (cases, inputs, baselines, bytes/FLOPs, forward + backward case)
kernels       every op x backend at its spec's cases; backward: forward + backward per op
kernel_suite  `bench kernels [--backward]`      model_suite   `bench models` (models: the model list, derived
train         `bench train`                                   from the architecture table; onnx_export)
embed         `bench embed` (the corpus job)    serve         `bench serve`       mlm_head   `bench mlm-head`
attention_cpu `bench attention-cpu`             lora_cost     `bench lora`        report     `bench report`
attention_relative `bench attention-relative` (its workloads: attention_relative_cases)
timing (the interleaved timer every program uses), ceilings (copy bandwidth, GEMM rate), latency (profiler
breakdowns), gemm_pack (`python -m fastenc.benchmark.gemm_pack`), isolated (one model per process), options
(what the subcommands share), cli (the wiring).
"""
