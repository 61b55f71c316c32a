"""pytest-benchmark: attention at BERT-base / ModernBERT-base / ViT-B/16 shapes, every provider (group: attention)."""
OP = "attention"


def test_attention(kernel_bench):
    kernel_bench()
