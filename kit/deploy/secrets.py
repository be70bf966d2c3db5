"""The router's client API key: read on the control machine, handed to Ansible only through the
environment of the ansible-playbook process, written on the router host only into its
environment file (mode 0600). It never appears in the Plan, the inventory, the command line,
the progress output or an error message.

ansible-runner records the environment of each run in ``artifacts/<run>/command``; the driver
deletes that file when the run ends (`kit.deploy.runner`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from kit.errors import DeployError
from kit.topology.plan import RouterProcess


def api_key_path(router: RouterProcess, topology_file: Path) -> Path | None:
    """The router's key file (`router.api_key_file`), a relative one taken from the topology's
    folder like a relative root; None when the key comes from a variable or there is none."""
    if not router.api_key_file:
        return None
    path = Path(router.api_key_file).expanduser()
    return path if path.is_absolute() else topology_file.absolute().parent / path


def router_api_key(
    router: RouterProcess, topology_file: Path, environ: Mapping[str, str]
) -> str | None:
    """The key named by `router.api_key_env` / `router.api_key_file`, or None when neither is
    set."""
    if router.api_key_env:
        value = environ.get(router.api_key_env, "").strip()
        if not value:
            raise DeployError(
                f"router.api_key_env names {router.api_key_env}, which is not set (or empty) in "
                "this shell; nothing was deployed. To fix: export "
                f"{router.api_key_env}=<key> before `pdkit up`, or remove router.api_key_env."
            )
        return value
    path = api_key_path(router, topology_file)
    if path is not None:
        try:
            value = path.read_text().strip()
        except OSError as exc:
            raise DeployError(
                f"router.api_key_file {path} cannot be read ({exc.strerror}); nothing was "
                "deployed. To fix: create the file with the key, or correct the path."
            ) from exc
        if not value:
            raise DeployError(
                f"router.api_key_file {path} is empty; nothing was deployed. "
                "To fix: write the key into it."
            )
        return value
    return None
