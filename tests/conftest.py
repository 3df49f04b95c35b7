import pytest

import helpers


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
