"""A deployment as the deploy commands see it: the Plan of a topology file plus where its state
lives on the control machine and its files on each host. Built once per command, from a Plan
resolved once."""

from __future__ import annotations

import difflib
import fcntl
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.errors import DeployError
from kit.hosts.inventory import DeployHost, build_inventory, deploy_hosts
from kit.hosts.logs import LogFile
from kit.hosts.state_dir import state_dir
from kit.plan.resolve import resolve
from kit.topology.plan_types import Plan


@dataclass(frozen=True)
class DeployContext:
    topology_file: Path
    plan: Plan
    state_dir: Path
    hosts: tuple[DeployHost, ...]

    @classmethod
    def build(
        cls,
        plan: Plan,
        topology_file: Path,
        state_base: Path | str | None = None,
        control_python: str | None = None,
    ) -> DeployContext:
        """The context of a resolved Plan. `control_python` is the interpreter local hosts run
        pdkit's processes with; default: this one (the control machine's venv)."""
        return cls(
            topology_file=topology_file,
            plan=plan,
            state_dir=state_dir(topology_file, plan.name, state_base),
            hosts=deploy_hosts(plan, control_python or sys.executable),
        )

    @property
    def private_dir(self) -> Path:
        """ansible-runner's private data dir (inventory, artifacts)."""
        return self.state_dir / "ansible"

    def inventory(self) -> dict[str, Any]:
        return build_inventory(self.plan, self.hosts)

    def host(self, name: str) -> DeployHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    @property
    def hosts_by_name(self) -> dict[str, DeployHost]:
        return {h.name: h for h in self.hosts}

    def process_names(self) -> list[str]:
        """Every process, workers in plan order then the router."""
        return list(self.plan.process_names)

    def process_host(self, process: str) -> DeployHost:
        return self.host(self.plan.process(process).host)

    def log_file(self, process: str) -> LogFile:
        return LogFile(process, self.process_host(process), self.plan.process(process).log_path)

    def select_processes(self, selector: str | None) -> list[str]:
        """Processes named by `selector`: a process name, a role (prefill, decode, router), or
        None for all. Unknown names raise with the closest match."""
        names = self.process_names()
        if selector is None:
            return names
        if selector in names:
            return [selector]
        by_role = [w.name for w in self.plan.workers if w.role == selector]
        if by_role:
            return by_role
        close = difflib.get_close_matches(selector, [*names, "prefill", "decode"], n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise DeployError(
            f"deployment {self.plan.name} has no process '{selector}'.{hint} "
            f"Its processes: {', '.join(names)} (or a role: prefill, decode)."
        )


def load_context(
    topology: Path, state_base: Path | str | None = None, control_python: str | None = None
) -> DeployContext:
    """Resolve the topology (every check runs first) and build its context."""
    plan = resolve(topology, state_base=state_base)
    return DeployContext.build(plan, topology, state_base, control_python)


@contextmanager
def deployment_lock(ctx: DeployContext) -> Iterator[None]:
    """One `pdkit up`/`down` per deployment at a time (a lock file in the state dir)."""
    ctx.state_dir.mkdir(parents=True, exist_ok=True)
    with open(ctx.state_dir / "lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise DeployError(
                f"another pdkit up/down of deployment {ctx.plan.name} is running ({holder}); "
                "nothing was changed. To fix: wait for it to finish, or stop it."
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        yield
