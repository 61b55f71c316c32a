"""pytest-benchmark: rope at BERT-base / ModernBERT-base / ViT-B/16 shapes, every provider (group: rope)."""
OP = "rope"


def test_rope(kernel_bench):
    kernel_bench()
