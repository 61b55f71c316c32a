"""pytest-benchmark: merge_lora at BERT-base / ModernBERT-base / ViT-B/16 shapes, every provider (group: merge_lora)."""
OP = "merge_lora"


def test_merge_lora(kernel_bench):
    kernel_bench()
