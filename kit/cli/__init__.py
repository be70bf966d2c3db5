"""The `pdkit` command line: thin. Each command builds the object it needs and calls the layer
below; `PdkitError` is caught once, in `main()`, and printed without a traceback (`--debug`
shows it).

Modules: `app` (the typer app, consoles, `main`), `options` (every option more than one command
takes, declared once), and one per command group: `topology` (validate, render, schema), `lb`,
`deploy` (up, restart, down, logs, provision, discover), `upgrade`, `observe` (health, status,
doctor, dashboard, trace), `bench`, `size`, `autoscale`. The library each command calls is imported
inside it, so that `pdkit --help` stays fast.
"""

from kit.cli import autoscale, bench, deploy, lb, observe, size, topology, upgrade
from kit.cli.app import app, main, order_commands

__all__ = [
    "app",
    "autoscale",
    "bench",
    "deploy",
    "lb",
    "main",
    "observe",
    "size",
    "topology",
    "upgrade",
]

order_commands(
    (
        "validate",
        "render",
        "schema",
        "lb",
        "health",
        "status",
        "up",
        "restart",
        "upgrade",
        "doctor",
        "down",
        "logs",
        "provision",
        "discover",
        "bench",
        "dashboard",
        "trace",
        "size",
        "autoscale",
    )
)
