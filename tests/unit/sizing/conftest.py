"""Sizing tests see an empty Hugging Face cache and their own calibration store, whatever the
machine holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kit.sizing.calibration import CALIBRATION_ENV


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch) -> Path:
    """An empty HF cache and a calibration store in tmp_path; returns the store's path."""
    cache = tmp_path / "hf-hub-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    store = tmp_path / "calibration.json"
    monkeypatch.setenv(CALIBRATION_ENV, str(store))
    return store


@pytest.fixture(scope="module")
def module_env(tmp_path_factory) -> Iterator[None]:
    """The same isolation for results a module computes once (slow searches)."""
    folder = tmp_path_factory.mktemp("sizing")
    (folder / "hf").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_CACHE", str(folder / "hf"))
        patch.setenv(CALIBRATION_ENV, str(folder / "calibration.json"))
        yield
