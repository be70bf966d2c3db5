"""Every error pdkit raises on purpose.

    PdkitError
    ├── TopologyError          the topology file is unreadable, malformed or inconsistent
    ├── RenderError            a Plan cannot be turned into commands
    │   └── UnsupportedVersion (kit/sglang/catalog.py) no flag catalog for that SGLang version
    ├── DeployError            Ansible or a readiness gate failed; says what is still running
    │   └── GateError          (kit/deploy/gate.py) the KV transfer gate failed; its findings apart
    ├── ProbeError             a worker or router could not be asked for its state
    ├── SecretError            (kit/secrets.py) a key asked for is missing, unreadable or empty
    ├── LbError                (kit/lb/errors.py) the load balancer cannot start or run
    │   ├── LbConfigError      a bad `pdkit lb` option, key file or worker URL
    │   └── TokenizerError     (kit/lb/tokenizer.py) the served model's tokenizer cannot be loaded
    ├── ModelConfigError       (kit/perf/models.py) a model config.json that cannot be read
    ├── UnknownGpuError        (kit/perf/gpus.py) a GPU the performance model has no numbers for
    ├── WorkloadError          (kit/perf/workload.py) a workload that cannot be built
    └── SizingError            (kit/sizing/problem.py) `pdkit size` cannot answer

Not PdkitErrors (they never reach the CLI): `kit.lb.errors.ApiError` (one failed client request
of the load balancer, answered as an OpenAI-style JSON error) and `kit.sim.errors.RequestRefused`
(a request the emulated SGLang worker refuses as SGLang would). A failed HTTP call is classified
in one place, `kit.net.classify_failure`.

The CLI catches `PdkitError` once, prints its message and exits non-zero (`--debug` shows the
traceback). Foreign exceptions are wrapped with `raise ... from exc` where they cross a layer.
"""

from __future__ import annotations

from dataclasses import dataclass


class PdkitError(Exception):
    """Base class: the message is meant for the user and says how to fix the problem."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a topology.

    `path` is the key path in the YAML (e.g. ``("prefill", "args", "page-size")``); `line` and
    `column` are 1-based positions in `file` when known.
    """

    path: tuple[str | int, ...]
    message: str
    fix: str = ""
    file: str = ""
    line: int | None = None
    column: int | None = None

    @property
    def key(self) -> str:
        out = ""
        for part in self.path:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
        return out or "(top level)"

    def __str__(self) -> str:
        where = self.file or "<topology>"
        if self.line is not None:
            where += f":{self.line}:{self.column or 1}"
        text = f"{where}: {self.key}: {self.message}"
        if self.fix:
            text += f" To fix: {self.fix}"
        return text


class TopologyError(PdkitError):
    """A topology that cannot be used; carries every problem found, not just the first."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        count = len(problems)
        head = f"{count} problem{'s' if count != 1 else ''} in the topology:"
        super().__init__("\n".join([head, *(f"  - {p}" for p in problems)]))


class RenderError(PdkitError):
    """A Plan that cannot be rendered into commands."""


class DeployError(PdkitError):
    """A deployment step failed; the message names the host, process or task and what runs."""


class ProbeError(PdkitError):
    """A worker or router could not be probed."""
