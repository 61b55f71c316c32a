"""pytest-benchmark: layer_norm at BERT-base / ModernBERT-base / ViT-B/16 shapes, every provider (group: layer_norm)."""
OP = "layer_norm"


def test_layer_norm(kernel_bench):
    kernel_bench()
