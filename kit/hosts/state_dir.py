"""Where a deployment's state lives on the control machine, and paths in messages.

The state dir is ``.pdkit/<name>/`` beside the topology file, or ``<base>/<name>/`` when
``--state-dir <base>`` or ``PDKIT_STATE_DIR=<base>`` is given. It holds Ansible's private data
dir (``ansible/``: inventory, artifacts of the last runs) and `pdkit discover`'s facts
(``discovered.json``, `kit.topology.facts`). The path is `kit.topology.layout.state_dir`, which
the Plan's resolution reads the facts through too; paths on the hosts are layout's as well.
"""

from __future__ import annotations

import os
from pathlib import Path

from kit.topology.layout import STATE_DIR_ENV, STATE_DIR_NAME, state_dir

__all__ = ["STATE_DIR_ENV", "STATE_DIR_NAME", "display_path", "state_dir"]


def display_path(path: str | Path) -> str:
    """`path` relative to the working directory, for messages (absolute when on another drive)."""
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)
