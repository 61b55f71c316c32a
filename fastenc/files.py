"""The JSON files of a model, tokenizer or adapter folder, read with errors that name the file and the caller."""
from __future__ import annotations

import json
from pathlib import Path


def read_json(path: Path, caller: str, kind: type = dict, what: str = ""):
    """The value of JSON file `path`, which must hold a `kind` (dict: an object, list: a list); a ValueError
    naming `caller` and the file otherwise (`what`, e.g. " (a config)", says what the object is)."""
    try:
        value = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{caller}: {path} is not valid JSON: {e}") from None
    if not isinstance(value, kind):
        raise ValueError(f"{caller}: {path} must hold a JSON {'object' if kind is dict else 'list'}{what}, got a "
                         f"{type(value).__name__}")
    return value
