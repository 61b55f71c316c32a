"""LoRA tests import their PEFT helpers from this folder and the small random-weight transformers models of
tests/models (_models_hf.py)."""
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parent / "models"))
sys.path.insert(0, str(here))
