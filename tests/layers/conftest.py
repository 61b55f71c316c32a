"""Layer tests (fastenc.layers) import their shared set-up (_layers.py) from this folder."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
