"""pytest-benchmark: lora_linear at BERT-base / ModernBERT-base / ViT-B/16 shapes, every provider (group: lora_linear)."""
OP = "lora_linear"


def test_lora_linear(kernel_bench):
    kernel_bench()
