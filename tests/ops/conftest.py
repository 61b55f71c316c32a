"""tests/ops on sys.path, so the op tests import each op's samples (`op_samples`) under --import-mode=importlib."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
