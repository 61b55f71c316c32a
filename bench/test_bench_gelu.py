"""pytest-benchmark: gelu at BERT-base / ModernBERT-base / ViT-B/16 shapes, every provider (group: gelu)."""
OP = "gelu"


def test_gelu(kernel_bench):
    kernel_bench()
