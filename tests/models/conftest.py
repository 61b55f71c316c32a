"""Model tests import their shared transformers fixtures (_models_hf.py) from this folder and the layer tests'
set-up (_layers.py) from tests/layers."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "layers"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
