"""Names and places of a deployment's processes on their hosts: process names, service (unit)
names, and where each process's files live under its host's root prefix. Pure: path arithmetic
and string formatting, nothing here touches the disk. The Plan records the results per process;
no later stage (deploy, the playbooks, observe) formats a name or a path again.

Names: instance ``<role>-<index>`` (``prefill-0``); process: the instance name, or
``<instance>-node<rank>`` for each node of a multi-node instance (``decode-1-node1``); the
router is ``router``, Prometheus (``monitoring:``) ``prometheus``, the KV pool's master
(``kv_pool:``) ``kv-pool``. systemd unit:
``pdkit-<deployment>-<process>.service``.

Host: everything lives under the host's root prefix (``root:`` in the topology, default ``/``).
A relative root is resolved against the folder of the topology file, so
``root: .pdkit/local/root`` in ``topologies/local.yaml`` means ``topologies/.pdkit/local/root``.
Under the root, for deployment ``<name>``::

    etc/pdkit/<name>/<process>.env                environment file (0600)
    etc/pdkit/<name>/supervisord.conf             supervisord config (supervisord hosts)
    etc/pdkit/<name>/supervisord.d/<process>.conf supervisord program definitions
    opt/pdkit/<name>/bin/<process>.sh             launch scripts; opt/pdkit/<name> is the cwd
    var/log/pdkit/<name>/<process>.log            process logs (kept by `pdkit down`)
    etc/pdkit/<name>/prometheus.yml               Prometheus' configuration (monitoring:)
    var/lib/pdkit/<name>/prometheus/              Prometheus' data (kept by `pdkit down`)
    run/pdkit/<name>/                             supervisord socket and pid file

and, shared by the deployments of a host, what provisioning puts there (remote hosts)::

    opt/pdkit/venv/                               the Python environment processes run in
    var/lib/pdkit/huggingface/                    HF_HOME: weights downloaded from the Hub

systemd units are the exception: systemd reads units only from ``/etc/systemd/system``, so they
go there whatever the root is.

The same path formulas are written in ``playbooks/group_vars/all.yml`` for running the
playbooks by hand; a unit test checks that both agree.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

SYSTEMD_UNIT_DIR = "/etc/systemd/system"
# A unix socket path must fit in sockaddr_un.sun_path (108 bytes with the NUL on Linux);
# deep test roots exceed it, so those sockets move to a short path derived from the long one.
MAX_SOCKET_PATH = 100


ROUTER_PROCESS = "router"
MONITORING_PROCESS = "prometheus"
KV_POOL_PROCESS = "kv-pool"


STATE_DIR_ENV = "PDKIT_STATE_DIR"
STATE_DIR_NAME = ".pdkit"


def state_dir(topology_file: Path, name: str, base: Path | str | None = None) -> Path:
    """The control-machine state dir of deployment `name`: ``<base>/<name>/`` (``--state-dir``,
    which wins over ``$PDKIT_STATE_DIR``), else ``.pdkit/<name>/`` beside the topology file.
    The result is absolute."""
    chosen = base if base is not None else os.environ.get(STATE_DIR_ENV) or None
    if chosen is not None:
        return Path(chosen).expanduser().absolute() / name
    return topology_file.absolute().parent / STATE_DIR_NAME / name


def instance_name(role: str, index: int) -> str:
    """``prefill-0``: an instance of a role."""
    return f"{role}-{index}"


def process_name(instance: str, node_rank: int, nnodes: int) -> str:
    """The process of one node of an instance: the instance's own name when it has one node."""
    return instance if nnodes == 1 else f"{instance}-node{node_rank}"


UNIT_PREFIX = "pdkit-"
UNIT_SUFFIX = ".service"
_SERVICES = f"{ROUTER_PROCESS}|{MONITORING_PROCESS}|{KV_POOL_PROCESS}"
PROCESS_PATTERN = rf"({_SERVICES}|(prefill|decode)-[0-9]+(-node[0-9]+)?)"
"""Every process name `process_name` can give (and the router's, Prometheus' and the KV
pool master's)."""


def service_name(deployment: str, process: str) -> str:
    """A process's name among the host's services: ``pdkit-<deployment>-<process>`` (its
    systemd unit's stem and its journal identifier)."""
    return f"{UNIT_PREFIX}{deployment}-{process}"


def unit_name(deployment: str, process: str) -> str:
    """The systemd unit of a process: ``pdkit-<deployment>-<process>.service``."""
    return service_name(deployment, process) + UNIT_SUFFIX


def unit_pattern(deployment: str) -> str:
    """A regular expression matching exactly the unit names of a deployment's processes (and
    no other deployment's, even one whose name extends this one)."""
    prefix = re.escape(f"{UNIT_PREFIX}{deployment}-")
    return f"^{prefix}{PROCESS_PATTERN}{re.escape(UNIT_SUFFIX)}$"


def host_root(root: str, topology_dir: Path) -> str:
    """The absolute root prefix of a host: a relative `root` is taken from the topology's
    folder (`topology_dir`, absolute). Hosts are POSIX machines, so the result is a POSIX path
    string; ``/`` stays ``/``."""
    path = PurePosixPath(root)
    if not path.is_absolute():
        path = PurePosixPath(topology_dir.as_posix()) / path
    return os.path.normpath(path.as_posix()) if path.as_posix() != "/" else "/"


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
    def prometheus_config(self) -> str:
        return _under(self.config_dir, "prometheus.yml")

    @property
    def prometheus_data_dir(self) -> str:
        return _under(self.root, "var/lib/pdkit", self.deployment, "prometheus")

    @property
    def keepalived_conf(self) -> str:
        """Debian's keepalived reads this file (one VIP configuration per host)."""
        return _under(self.root, "etc/keepalived/keepalived.conf")

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

    def program_conf(self, process: str) -> str:
        """The supervisord program definition of a process."""
        return _under(self.supervisord_program_dir, f"{process}.conf")

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
