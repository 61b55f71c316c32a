"""pytest-benchmark: geglu at BERT-base / ModernBERT-base / ViT-B/16 shapes, every provider (group: geglu)."""
OP = "geglu"


def test_geglu(kernel_bench):
    kernel_bench()
