"""Training tests share the transformers fixtures of tests/models (_models_hf.py), the layer set-up of tests/layers
(_layers.py) and _train.py's helpers."""
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parent / "models"))
sys.path.insert(0, str(here.parent / "layers"))
sys.path.insert(0, str(here))
