"""Find a model's ``config.json`` in the local Hugging Face hub cache, without a network.

The cache folder is the one ``huggingface_hub`` uses: ``$HF_HUB_CACHE``, else
``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
``~/.cache/huggingface/hub``. A repository ``org/name`` lives in ``models--org--name/``:
``refs/main`` holds the commit hash of the main branch and ``snapshots/{hash}/`` the files of
that commit. The config of ``refs/main`` is taken when its snapshot has one, else the newest
snapshot that holds a ``config.json``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def hub_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The hub cache folder for the environment `env` (default: this process's)."""
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "huggingface" / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def is_repo_id(name: str) -> bool:
    """True for a hub repository id, ``org/name`` (not an absolute or relative path)."""
    parts = name.split("/")
    return (
        len(parts) == 2
        and all(parts)
        and not name.startswith((".", "~"))
        and all(part not in (".", "..") for part in parts)
    )


def cached_config(repo_id: str, cache: Path | None = None) -> Path | None:
    """The cached ``config.json`` of `repo_id` (``org/name``), or None when the cache has
    none. Only reads the file system."""
    if not is_repo_id(repo_id):
        return None
    repo = (cache or hub_cache_dir()) / f"models--{repo_id.replace('/', '--')}"
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    main = repo / "refs" / "main"
    if main.is_file():
        commit = main.read_text(encoding="utf-8").strip()
        config = snapshots / commit / "config.json"
        if commit and config.is_file():
            return config
    holding = [s for s in snapshots.iterdir() if (s / "config.json").is_file()]
    if not holding:
        return None
    newest = max(holding, key=lambda s: (s.stat().st_mtime, s.name))
    return newest / "config.json"
