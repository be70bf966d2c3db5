"""Where a deployment's state lives on the control machine, and paths in messages.

The state dir is ``.pdkit/<name>/`` beside the topology file, or ``<base>/<name>/`` when
``--state-dir <base>`` or ``PDKIT_STATE_DIR=<base>`` is given. It holds Ansible's private data
dir (``ansible/``: inventory, artifacts of the last runs). Paths on the hosts are
`kit.topology.layout`'s.
"""

from __future__ import annotations

import os
from pathlib import Path

STATE_DIR_ENV = "PDKIT_STATE_DIR"
STATE_DIR_NAME = ".pdkit"


def state_dir(topology_file: Path, name: str, base: Path | str | None = None) -> Path:
    """The control-machine state dir of deployment `name`.

    `base` (from ``--state-dir``) wins over ``$PDKIT_STATE_DIR``, which wins over ``.pdkit/``
    beside the topology file. The result is absolute.
    """
    chosen = base if base is not None else os.environ.get(STATE_DIR_ENV) or None
    if chosen is not None:
        return Path(chosen).expanduser().absolute() / name
    return topology_file.absolute().parent / STATE_DIR_NAME / name


def display_path(path: str | Path) -> str:
    """`path` relative to the working directory, for messages (absolute when on another drive)."""
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)
