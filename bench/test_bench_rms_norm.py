"""pytest-benchmark: rms_norm at BERT-base / ModernBERT-base / ViT-B/16 shapes, every provider (group: rms_norm)."""
OP = "rms_norm"


def test_rms_norm(kernel_bench):
    kernel_bench()
