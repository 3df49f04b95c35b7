import warnings

import pytest

import helpers

# PyTorch (an optional peer) is imported once, before any test runs. On the H200 host
# (torch 2.11), a first import after the GPU tests had run failed inside torch's own
# schema parser ("expected ident but found ')' here: annotate(strtag) -> ()"), and every
# later import then failed differently (a partially initialized torch); the same import
# at the start of a process works. A failure is reported, not hidden: the tests that
# need PyTorch then fail or skip with it.
try:
    import torch  # noqa: F401
except ImportError:
    pass
except Exception as error:  # noqa: BLE001
    warnings.warn(f"PyTorch is installed but failed to import: {type(error).__name__}: {error}")


@pytest.fixture
def gpu():
    """The GPU; tests that take this fixture are skipped where there is none."""
    reason = helpers.no_gpu_reason()
    if reason:
        pytest.skip(f"needs a GPU: {reason}")
    return helpers.gpu()


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty compile cache, on disk and in memory."""
    from helpers import compiler
    monkeypatch.setenv("BOOK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(compiler, "_memory_cache", {})
    return tmp_path / "cache"
