"""Perf tests see an empty Hugging Face cache, whatever the machine has downloaded."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def empty_hf_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf-hub-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache
