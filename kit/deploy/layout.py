"""Where a deployment's files live: on the control machine (state dir) and on each host (root
prefix). Pure path arithmetic; nothing here touches the disk.

Control machine: the state dir is ``.pdkit/<name>/`` beside the topology file, or
``<base>/<name>/`` when ``--state-dir <base>`` or ``PDKIT_STATE_DIR=<base>`` is given. It holds
Ansible's private data dir (``ansible/``: inventory, artifacts of the last runs).

Host: everything lives under the host's root prefix (``root:`` in the topology, default ``/``).
A relative root is resolved against the folder of the topology file, so
``root: .pdkit/local/root`` in ``topologies/local.yaml`` means ``topologies/.pdkit/local/root``.
Under the root, for deployment ``<name>``::

    etc/pdkit/<name>/<process>.env                environment file (0600)
    etc/pdkit/<name>/supervisord.conf             supervisord config (supervisord hosts)
    etc/pdkit/<name>/supervisord.d/<process>.conf supervisord program definitions
    opt/pdkit/<name>/bin/<process>.sh             launch scripts; opt/pdkit/<name> is the cwd
    var/log/pdkit/<name>/<process>.log            process logs (kept by `pdkit down`)
    run/pdkit/<name>/                             supervisord socket and pid file

and, shared by the deployments of a host, what provisioning puts there (remote hosts)::

    opt/pdkit/venv/                               the Python environment processes run in
    var/lib/pdkit/huggingface/                    HF_HOME: weights downloaded from the Hub

systemd units are the exception: systemd reads units only from ``/etc/systemd/system``, so they
go there (``pdkit-<name>-<process>.service``) whatever the root is.

The same formulas are written in ``playbooks/group_vars/all.yml`` for running the playbooks by
hand; a unit test checks that both agree.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

STATE_DIR_ENV = "PDKIT_STATE_DIR"
STATE_DIR_NAME = ".pdkit"
SYSTEMD_UNIT_DIR = "/etc/systemd/system"
# A unix socket path must fit in sockaddr_un.sun_path (108 bytes with the NUL on Linux);
# deep test roots exceed it, so those sockets move to a short path derived from the long one.
MAX_SOCKET_PATH = 100


def state_dir(topology_file: Path, name: str, base: Path | str | None = None) -> Path:
    """The control-machine state dir of deployment `name`.

    `base` (from ``--state-dir``) wins over ``$PDKIT_STATE_DIR``, which wins over ``.pdkit/``
    beside the topology file. The result is absolute.
    """
    chosen = base if base is not None else os.environ.get(STATE_DIR_ENV) or None
    if chosen is not None:
        return Path(chosen).expanduser().absolute() / name
    return topology_file.absolute().parent / STATE_DIR_NAME / name


def host_root(root: str, topology_file: Path) -> str:
    """The absolute root prefix of a host: a relative `root` is taken from the topology's folder.

    Hosts are POSIX machines, so the result is a POSIX path string; ``/`` stays ``/``.
    """
    path = PurePosixPath(root)
    if not path.is_absolute():
        path = PurePosixPath(topology_file.absolute().parent.as_posix()) / path
    return os.path.normpath(path.as_posix()) if path.as_posix() != "/" else "/"


def display_path(path: str | Path) -> str:
    """`path` relative to the working directory, for messages (absolute when on another drive)."""
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def _under(root: str, *parts: str) -> str:
    return str(PurePosixPath(root, *parts))


@dataclass(frozen=True)
class HostLayout:
    """The paths of one deployment on one host (POSIX path strings, absolute)."""

    deployment: str
    root: str

    @property
    def config_dir(self) -> str:
        return _under(self.root, "etc/pdkit", self.deployment)

    @property
    def work_dir(self) -> str:
        return _under(self.root, "opt/pdkit", self.deployment)

    @property
    def bin_dir(self) -> str:
        return _under(self.work_dir, "bin")

    @property
    def log_dir(self) -> str:
        return _under(self.root, "var/log/pdkit", self.deployment)

    @property
    def run_dir(self) -> str:
        return _under(self.root, "run/pdkit", self.deployment)

    @property
    def venv_dir(self) -> str:
        """The Python environment provisioning makes (pdkit_python_venv)."""
        return _under(self.root, "opt/pdkit/venv")

    @property
    def hf_home(self) -> str:
        """Where provisioning downloads weights (pdkit_model_hf_home) and workers look."""
        return _under(self.root, "var/lib/pdkit/huggingface")

    @property
    def supervisord_conf(self) -> str:
        return _under(self.config_dir, "supervisord.conf")

    @property
    def supervisord_program_dir(self) -> str:
        return _under(self.config_dir, "supervisord.d")

    @property
    def supervisord_socket(self) -> str:
        """The control socket; a short /tmp path when the natural one is too long for a socket."""
        natural = _under(self.run_dir, "supervisord.sock")
        if len(natural) <= MAX_SOCKET_PATH:
            return natural
        digest = hashlib.sha1(natural.encode(), usedforsecurity=False).hexdigest()[:16]
        return f"/tmp/pdkit-{self.deployment[:32]}-{digest}.sock"

    @property
    def systemd_unit_dir(self) -> str:
        return SYSTEMD_UNIT_DIR

    def env_file(self, process: str) -> str:
        return _under(self.config_dir, f"{process}.env")

    def launch_script(self, process: str) -> str:
        return _under(self.bin_dir, f"{process}.sh")

    def log_file(self, process: str) -> str:
        return _under(self.log_dir, f"{process}.log")

    def systemd_unit(self, process: str) -> str:
        return f"pdkit-{self.deployment}-{process}.service"

    def ansible_vars(self) -> dict[str, str]:
        """The layout as the host variables the playbooks read (see group_vars/all.yml)."""
        return {
            "pdkit_config_dir": self.config_dir,
            "pdkit_work_dir": self.work_dir,
            "pdkit_bin_dir": self.bin_dir,
            "pdkit_log_dir": self.log_dir,
            "pdkit_run_dir": self.run_dir,
            "pdkit_supervisord_conf": self.supervisord_conf,
            "pdkit_supervisord_program_dir": self.supervisord_program_dir,
            "pdkit_supervisord_socket": self.supervisord_socket,
            "pdkit_systemd_unit_dir": self.systemd_unit_dir,
        }
