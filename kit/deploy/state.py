"""What runs, recorded per deployment: ``<state dir>/deployed.json``.

`pdkit up` and `pdkit restart` write it as they go (after each instance has joined, been replaced
or been removed), so the next `pdkit up` compares the topology with what really runs instead of
guessing. Per process it keeps where it runs (host, GPUs, ports, URL), what it runs (its
command's flags as the Plan holds them, each with its values, and its environment: the reasons
`pdkit up --diff` prints) and a fingerprint of everything its files
on the host are made of: its inventory record, the host's layout and interpreter, and the
templates of the pdkit_process role. Two records with equal fingerprints mean the playbook would
write the same files, so the process needs no restart. The router's fingerprint leaves out its
worker list, which changes live through its worker API.

The record holds no secret: the inventory names secrets only by variable. Written atomically,
0600, like the rest of the state dir. A record of format 1 (pdkit before the flags were kept)
holds each command as its rendered argv: `_flags_of_format_1` reads it, the one place where an
argv pdkit wrote is split again, so that a deployment made by that release can still change.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from kit.errors import DeployError
from kit.hosts.inventory import DeployHost, host_vars
from kit.topology.args import Flag
from kit.topology.plan_types import KvPoolProcess, MonitoringProcess, Plan

RECORD_FILE = "deployed.json"
RECORD_FORMAT = 2
"""2: each process's `flags`; 1: its rendered `args` (still read)."""
STARTS_FILE = "starts.json"
"""Each instance's last measured start, seconds (`kit.deploy.surge` estimates from it)."""
WINDOWS_FILE = "windows.json"
"""Each instance's recent measured replacements, seconds by phase (stop, start, gate, readmit):
the time its role's requests wait when it is the role's only instance (`kit.deploy.surge`)."""
RECENT_WINDOWS = 5
"""How many replacements per instance windows.json keeps (the estimate takes their worst)."""
TEMPLATES = Path("roles") / "pdkit_process" / "templates"
"""The templates every process's files are rendered from, under the playbooks folder."""

ProcessRole = Literal["prefill", "decode", "router", "monitoring", "kv_pool"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProcessRecord(_Frozen):
    """One process as deployed."""

    name: str
    instance: str
    """The instance it belongs to (`prefill-0`; the router and Prometheus are their own)."""
    role: ProcessRole
    host: str
    unit: str
    node_rank: int = 0
    gpus: tuple[int, ...] = ()
    http_port: int | None = None
    url: str | None = None
    """The HTTP URL clients and the router use (node rank 0 of a worker instance, the router)."""
    bootstrap_port: int | None = None
    flags: tuple[Flag, ...] = ()
    """Its command's flags, each with its values (the router: its settings, not its workers)."""
    env: dict[str, str] = {}
    fingerprint: str

    @model_validator(mode="before")
    @classmethod
    def _format_1(cls, data: Any) -> Any:
        if isinstance(data, dict) and "args" in data and "flags" not in data:
            rest = {k: v for k, v in data.items() if k != "args"}
            return {**rest, "flags": _flags_of_format_1(data["args"])}
        return data


def _flags_of_format_1(args: Iterable[str]) -> list[list[str]]:
    """The flags of an argv that a format-1 record kept (pdkit wrote it, one flag and its
    values after another): a new flag at each `--name`, as that release's diff read it."""
    flags: list[list[str]] = []
    for arg in args:
        if re.match(r"^--[a-z]", arg) or not flags:
            flags.append([arg])
        else:
            flags[-1].append(arg)
    return flags


class DeploymentRecord(_Frozen):
    """Every process of a deployment as deployed, in the Plan's order."""

    format: int = RECORD_FORMAT
    deployment: str
    engine: str
    transfer_backend: str
    router_kind: str
    processes: tuple[ProcessRecord, ...]

    @model_validator(mode="before")
    @classmethod
    def _read_as_current(cls, data: Any) -> Any:
        # An older record is read into this format (`ProcessRecord` turns its argv into flags).
        if isinstance(data, dict) and data.get("format", RECORD_FORMAT) < RECORD_FORMAT:
            return {**data, "format": RECORD_FORMAT}
        return data

    def process(self, name: str) -> ProcessRecord | None:
        return next((p for p in self.processes if p.name == name), None)

    def instances(self) -> dict[str, tuple[ProcessRecord, ...]]:
        """Worker instances by name, each with its processes in node-rank order."""
        found: dict[str, list[ProcessRecord]] = {}
        for process in self.processes:
            if process.role in ("prefill", "decode"):
                found.setdefault(process.instance, []).append(process)
        return {name: tuple(sorted(p, key=lambda x: x.node_rank)) for name, p in found.items()}

    def without(self, names: Iterable[str]) -> DeploymentRecord:
        """This record without the processes called `names` (they were stopped)."""
        gone = set(names)
        return self.model_copy(
            update={"processes": tuple(p for p in self.processes if p.name not in gone)}
        )

    def with_processes(
        self, updated: Iterable[ProcessRecord], plan_order: list[str]
    ) -> DeploymentRecord:
        """This record with `updated` added or replacing processes of the same name, in
        `plan_order` (names not in it, e.g. ones still to be removed, keep their place last)."""
        by_name = {p.name: p for p in self.processes}
        by_name.update({p.name: p for p in updated})
        rank = {name: i for i, name in enumerate(plan_order)}
        ordered = sorted(by_name.values(), key=lambda p: rank.get(p.name, len(rank)))
        return self.model_copy(update={"processes": tuple(ordered)})


SUPERVISORD_TEMPLATE = "supervisord.conf.j2"
"""supervisord's own configuration: not part of any process's files (a process restarted does
not apply it; supervisord's next start does, see the pdkit_process role's handlers)."""


def templates_digest(playbooks: Path) -> str:
    """A digest of the pdkit_process role's templates that make each process's files (a change
    rewrites every process's files, so each is replaced, instance by instance)."""
    digest = hashlib.sha256()
    folder = playbooks / TEMPLATES
    for path in sorted(folder.glob("*.j2")):
        if path.name == SUPERVISORD_TEMPLATE:
            continue
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _fingerprint(*parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _host_settings(vars_: dict[str, Any]) -> dict[str, Any]:
    """The host variables a process's files are made of (interpreter, manager, layout)."""
    skip = {"pdkit_processes", "pdkit_unit_pattern"}
    return {k: v for k, v in vars_.items() if k.startswith("pdkit_") and k not in skip}


def build_record(plan: Plan, hosts: tuple[DeployHost, ...], templates: str) -> DeploymentRecord:
    """The record of `plan` deployed on `hosts`; `templates` is `templates_digest`. Pure."""
    by_host = {host.name: host_vars(host, plan) for host in hosts}
    records = {
        record["name"]: (record, _host_settings(vars_))
        for vars_ in by_host.values()
        for record in vars_["pdkit_processes"]
    }
    out: list[ProcessRecord] = []
    for worker in plan.workers:
        record, host = records[worker.name]
        out.append(
            ProcessRecord(
                name=worker.name,
                instance=worker.instance_name,
                role=worker.role,
                host=worker.host,
                unit=worker.unit,
                node_rank=worker.node_rank,
                gpus=worker.gpus,
                http_port=worker.http_port,
                url=worker.url if worker.serves_http else None,
                bootstrap_port=worker.bootstrap_port if worker.serves_http else None,
                flags=worker.command.flags,
                env=worker.env,
                fingerprint=_fingerprint(record, host, templates),
            )
        )
    router = plan.router
    # The router's own host's record (router.hosts: each replica has one under this name).
    record = next(r for r in by_host[router.host]["pdkit_processes"] if r["name"] == router.name)
    host = _host_settings(by_host[router.host])
    settings = {**record, "args": list(router.settings_args)}  # the fingerprint's form
    out.append(
        ProcessRecord(
            name=router.name,
            instance=router.name,
            role="router",
            host=router.host,
            unit=router.unit,
            http_port=router.port,
            url=router.url,
            flags=router.settings,
            env=router.env,
            fingerprint=_fingerprint(settings, host, templates),
        )
    )
    # The single processes beside the workers and the router: (process, role, port, url).
    singles: list[tuple[MonitoringProcess | KvPoolProcess, str, int, str | None]] = []
    if plan.monitoring is not None:
        singles.append((plan.monitoring, "monitoring", plan.monitoring.port, None))
    if plan.kv_pool is not None:
        singles.append((plan.kv_pool, "kv_pool", plan.kv_pool.metrics_port, plan.kv_pool.url))
    for process, role, port, url in singles:
        record, host = records[process.name]
        out.append(
            ProcessRecord(
                name=process.name,
                instance=process.name,
                role=role,
                host=process.host,
                unit=process.unit,
                http_port=port,
                url=url,
                flags=process.command.flags,
                env=process.env,
                fingerprint=_fingerprint(record, host, templates),
            )
        )
    return DeploymentRecord(
        deployment=plan.name,
        engine=plan.engine,
        transfer_backend=plan.transfer_backend,
        router_kind=router.kind,
        processes=tuple(out),
    )


def record_path(state_dir: Path) -> Path:
    return state_dir / RECORD_FILE


def load_record(state_dir: Path) -> DeploymentRecord | None:
    """The recorded deployment, or None when nothing was recorded (never deployed, or brought
    down). A record that cannot be read is an error that says how to start over."""
    path = record_path(state_dir)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DeployError(f"cannot read the deployment record {path}: {exc}") from exc
    try:
        return DeploymentRecord.model_validate_json(text)
    except ValidationError as exc:
        raise DeployError(
            f"the deployment record {path} is not one this pdkit can read "
            f"({exc.error_count()} problem(s), e.g. {exc.errors()[0]['msg']}). To fix: delete "
            "it; the next `pdkit up` then deploys every process as on a first run (processes "
            "whose files change restart at once)."
        ) from exc


def save_record(state_dir: Path, record: DeploymentRecord) -> None:
    """Write the record atomically (0600)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    text = record.model_dump_json(indent=2) + "\n"
    fd, temp = tempfile.mkstemp(dir=state_dir, prefix=".deployed-")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(temp, 0o600)
        os.replace(temp, record_path(state_dir))
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _measured(path: Path) -> dict[str, Any]:
    """A measurements file's object; empty when it is missing or unreadable (measurements are
    only an estimate's source)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load_starts(state_dir: Path) -> dict[str, float]:
    """Each instance's last measured start (seconds from its deploy to /health), by name;
    empty when none was measured or the file cannot be read (it is only an estimate's source)."""
    data = _measured(state_dir / STARTS_FILE)
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}


def save_starts(state_dir: Path, measured: dict[str, float]) -> None:
    """Add `measured` (seconds by instance) to the recorded starts."""
    starts = load_starts(state_dir) | {k: round(v, 2) for k, v in measured.items()}
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / STARTS_FILE).write_text(json.dumps(starts, indent=2, sort_keys=True) + "\n")


def load_windows(state_dir: Path) -> dict[str, list[dict[str, float]]]:
    """Each instance's recent measured replacements (oldest first, at most `RECENT_WINDOWS`),
    each seconds by phase, by instance name; empty when none was measured or the file cannot be
    read (it is only an estimate's source). A file of one window per instance (pdkit before the
    recent ones were kept) reads as that one."""
    data = _measured(state_dir / WINDOWS_FILE)
    out: dict[str, list[dict[str, float]]] = {}
    for name, recent in data.items():
        listed = [recent] if isinstance(recent, dict) else recent
        if not isinstance(listed, list):
            continue
        out[str(name)] = [
            {str(k): float(v) for k, v in phases.items() if isinstance(v, int | float)}
            for phases in listed
            if isinstance(phases, dict)
        ][-RECENT_WINDOWS:]
    return out


def save_windows(state_dir: Path, measured: dict[str, dict[str, float]]) -> None:
    """Add `measured` (seconds by phase, by instance) to the recorded replacements, keeping each
    instance's last `RECENT_WINDOWS`."""
    windows = load_windows(state_dir)
    for name, phases in measured.items():
        rounded = {k: round(v, 2) for k, v in phases.items()}
        windows[name] = [*windows.get(name, []), rounded][-RECENT_WINDOWS:]
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / WINDOWS_FILE).write_text(json.dumps(windows, indent=2, sort_keys=True) + "\n")


def forget_record(state_dir: Path) -> None:
    """`pdkit down`: nothing runs any more."""
    record_path(state_dir).unlink(missing_ok=True)
