"""Run pdkit's playbooks with ansible-runner, from Python.

The private data dir is ``<state dir>/ansible``: ``inventory/hosts.json`` (written from the
Plan before each run, readable: it holds no secret) and ``artifacts/<run>/`` (Ansible's output
``stdout`` and its ``job_events``; the last 20 runs are kept). The project dir is pdkit's
playbooks folder, package data of ``kit.playbooks`` (see `playbooks_dir`). ansible-playbook is
the one installed beside this interpreter.

Ansible's own output is not printed (``--verbose`` shows it); each event goes through
`RunProgress`, and a listener (the rich view) shows what it returns.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from kit.errors import DeployError
from kit.hosts.events import RunProgress

PLAYBOOKS_ENV = "PDKIT_PLAYBOOKS"
PLAYBOOKS_PACKAGE = "kit.playbooks"
KEEP_RUNS = 20

Listener = Callable[[RunProgress, list[str], Mapping[str, Any]], None]
"""Called after every event with the progress, the lines to show, and the raw event."""


def playbooks_dir(scratch: Path) -> Path:
    """pdkit's playbooks folder: ``$PDKIT_PLAYBOOKS`` when set, else the package data
    ``kit.playbooks`` (``site-packages/kit/playbooks`` of an installed wheel, the repository's
    ``playbooks/`` in an editable install). Package data that is no folder on disk (pdkit
    imported from a zip) is copied to ``scratch/playbooks`` first: ansible-playbook reads files."""
    found = _playbooks()
    if isinstance(found, Path):
        return found
    return extract_tree(found, scratch / "playbooks")


def start_host_script(argv: list[str], role: str, name: str) -> subprocess.Popen[str]:
    """Start `argv` (a host's Python reading its script from stdin, over SSH or local) with the
    host script `name` of `role` sent on stdin, stdout and stderr piped: a probe left serving
    while the caller reads its lines."""
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None
    proc.stdin.write(host_script(role, name))
    proc.stdin.close()
    return proc


def host_script(role: str, name: str) -> str:
    """The text of a host script in a role's ``files/`` of the same playbooks folder, for the
    scripts pdkit itself sends to a host's Python on stdin (the transfer and KV pool probes)."""
    script = _playbooks().joinpath("roles", role, "files", name)
    try:
        return script.read_text()
    except OSError as exc:
        raise DeployError(
            f"pdkit's host script roles/{role}/files/{name} cannot be read ({exc}). To fix: "
            f"reinstall pdkit, or point {PLAYBOOKS_ENV} at a complete playbooks folder."
        ) from exc


def _playbooks() -> Traversable:
    """The playbooks folder as `playbooks_dir` finds it, a zip's resource folder left as is."""
    override = os.environ.get(PLAYBOOKS_ENV)
    if override:
        path = Path(override)
        if not (path / "deploy.yml").is_file():
            raise DeployError(
                f"{PLAYBOOKS_ENV}={override} has no deploy.yml. To fix: point {PLAYBOOKS_ENV} at "
                "pdkit's playbooks folder, or unset it to use the playbooks installed with pdkit."
            )
        return path
    reinstall = (
        "To fix: reinstall pdkit (pip install sglang-pdkit, or pip install -e . in its "
        f"repository), or set {PLAYBOOKS_ENV} to a playbooks folder."
    )
    try:
        shipped = resources.files(PLAYBOOKS_PACKAGE)
    except ModuleNotFoundError as exc:
        raise DeployError(
            f"pdkit's playbooks ({PLAYBOOKS_PACKAGE}) are not installed with it. {reinstall}"
        ) from exc
    if not shipped.joinpath("deploy.yml").is_file():
        raise DeployError(f"pdkit's playbooks at {shipped} have no deploy.yml. {reinstall}")
    return shipped


def extract_tree(source: Traversable, target: Path) -> Path:
    """Copy a resource folder (e.g. inside a zip) to `target`, replacing what was there."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for entry in source.iterdir():
        if entry.is_dir():
            extract_tree(entry, target / entry.name)
        else:
            (target / entry.name).write_bytes(entry.read_bytes())
    return target


def ansible_bin_dir() -> Path:
    """The folder holding ansible-playbook: beside this interpreter (the venv pdkit runs in)."""
    here = Path(sys.executable).parent
    if (here / "ansible-playbook").exists():
        return here
    raise DeployError(
        f"ansible-playbook is not installed beside {sys.executable}. To fix: "
        f"{sys.executable} -m pip install ansible-core ansible-runner"
    )


@dataclass(frozen=True)
class PlaybookResult:
    playbook: str
    tags: str | None
    status: str
    rc: int
    progress: RunProgress
    artifact_dir: Path

    @property
    def ok(self) -> bool:
        return self.status == "successful" and self.rc == 0

    def output_tail(self, lines: int = 20) -> str:
        """The end of Ansible's own output (for errors raised before any task ran)."""
        try:
            text = (self.artifact_dir / "stdout").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])


def write_inventory(private_dir: Path, inventory: Mapping[str, Any]) -> Path:
    """Write the inventory as JSON (sorted, indented: people read it when debugging)."""
    path = private_dir / "inventory" / "hosts.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(inventory, indent=2, sort_keys=True) + "\n"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def ansible_env(bin_dir: Path, roles_dir: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """Environment additions for ansible-playbook (ansible-runner adds them to os.environ)."""
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "ANSIBLE_ROLES_PATH": str(roles_dir),
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_NOCOLOR": "True",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
        # ansible-runner turns host key checking off unless told otherwise; pdkit keeps it on.
        "ANSIBLE_HOST_KEY_CHECKING": os.environ.get("ANSIBLE_HOST_KEY_CHECKING", "True"),
        **extra,
    }


def run_playbook(
    private_dir: Path,
    inventory: Mapping[str, Any],
    playbook: str,
    *,
    tags: str | None = None,
    secret_env: Mapping[str, str] | None = None,
    listener: Listener | None = None,
    verbose: bool = False,
    forks: int = 10,
    cmdline: str | None = None,
) -> PlaybookResult:
    """Run one playbook of pdkit's playbooks dir; never raises for a failed task (the result
    says), only when Ansible cannot be started at all. `cmdline`: more ansible-playbook
    options (e.g. "--check --skip-tags nvidia")."""
    import ansible_runner  # noqa: PLC0415 (slow import; only commands that deploy pay it)

    project = playbooks_dir(private_dir)
    inventory_file = write_inventory(private_dir, inventory)
    progress = RunProgress()
    ident = f"{time.strftime('%Y%m%dT%H%M%S')}-{Path(playbook).stem}-{tags or 'all'}-"
    ident += uuid.uuid4().hex[:6]

    def handle(event: dict[str, Any]) -> bool:
        lines = progress.feed(event)
        if verbose and event.get("stdout"):
            lines = [str(event["stdout"]).replace("\r", "")]
        if listener is not None:
            listener(progress, lines, event)
        return True

    envvars = ansible_env(ansible_bin_dir(), project / "roles", secret_env or {})
    artifact_dir = private_dir / "artifacts" / ident
    try:
        run = ansible_runner.run(
            private_data_dir=str(private_dir),
            project_dir=str(project),
            playbook=playbook,
            inventory=str(inventory_file),
            tags=tags,
            envvars=envvars,
            ident=ident,
            quiet=True,
            suppress_env_files=True,
            rotate_artifacts=KEEP_RUNS,
            forks=forks,
            cmdline=cmdline,
            event_handler=handle,
        )
    except Exception as exc:  # ansible-runner's own errors (config, missing binary, ...)
        raise DeployError(f"cannot run Ansible ({playbook}): {exc}") from exc
    finally:
        # ansible-runner records the run's whole environment, secrets included.
        (artifact_dir / "command").unlink(missing_ok=True)
    return PlaybookResult(
        playbook=playbook,
        tags=tags,
        status=str(run.status),
        rc=int(run.rc if run.rc is not None else -1),
        progress=progress,
        artifact_dir=artifact_dir,
    )


def failure_report(result: PlaybookResult) -> str:
    """What went wrong in a failed run: each failed host/task with its output, or Ansible's own
    output when it failed before any task."""
    stage = f" ({result.tags} stage)" if result.tags else ""
    lines = [f"Ansible failed in {result.playbook}{stage}."]
    if result.progress.failures:
        lines += [failure.describe() for failure in result.progress.failures]
    else:
        lines.append(f"ansible-playbook exited with {result.rc} ({result.status}):")
        lines += [f"  {line}" for line in result.output_tail().splitlines()]
    lines.append(f"Ansible's full output: {result.artifact_dir / 'stdout'}")
    return "\n".join(lines)
