"""tests/layers/_layers.py under the name the tests that put only this folder on their path import (tests/train):
the same module, loaded from its own file."""
import importlib.util
import sys
from pathlib import Path

_path = Path(__file__).resolve().parent.parent / "layers" / "_layers.py"
_spec = importlib.util.spec_from_file_location("_layers", _path)
_module = importlib.util.module_from_spec(_spec)
sys.modules[__name__] = _module
_spec.loader.exec_module(_module)
