"""How long an instance is away while it restarts, by pdkit's figures per engine, and the warning
for a role whose only instance spans several hosts. Pure.

1. A replacement pdkit runs (`pdkit restart`, a live `pdkit up`) has four phases: stop, start,
   gate, readmission (`PHASES`); `kit.deploy.surge` takes each from the instance's measured
   replacements, else from `EXPECTED_S`, and multiplies the sum by `MARGIN`.
2. A rank that dies on its own skips the stop: the instance's ranks restart together (a
   multi-node instance lives and dies as one group: under Ansible the leader's agent in
   `kit.ranks` restarts every rank, under Slurm its job step is started again as a whole), then
   it is gated and readmitted (`UNPLANNED`).
3. Meanwhile a role with no other instance has none, and the router holds its requests only
   `router.faults.hold_timeout_s` (smg holds none): `only_instance_warnings` says so up front.
"""

from __future__ import annotations

import math

from kit.errors import Problem
from kit.topology.place import Placement
from kit.topology.schema import ROLE_NAMES, Router, Topology

PHASES = {"stop": "stop", "start": "start", "gate": "gate", "readmit": "readmission"}
"""The phases of a replacement, as recorded (`kit.deploy.state.WINDOWS_FILE`) and as printed."""
EXPECTED_S = {
    "sim": {"stop": 3.0, "start": 5.0, "gate": 0.5, "readmit": 0.5},
    "sglang": {"stop": 10.0, "start": 110.0, "gate": 20.0, "readmit": 2.0},
}
"""Seconds per phase when none was measured. The sim's, measured on the local default here
(2P1D, supervisord, under load): stop 2-4 s (the drain and Ansible's stop playbook), start
4-14 s (the deploy playbook to /health, the more the busier the machine), gate 0.2 s,
readmission 0.3 s. SGLang starts in 30-110 s on CPU hosts here with a small model, more
with real weights on GPUs; its drain on SIGTERM and a real gate request take longer too."""
MARGIN = 2.0
"""The estimate is the phases' sum times this: a window is measured on whatever load the machine
had then, and load stretches it. Measured here (local default, sim, 2 cores): the only decode's
replacement took 19-20 s alone and 35 s beside make test's parallel modules."""
UNPLANNED = ("start", "gate", "readmit")
"""The phases of a restart after a rank died: nothing is drained or stopped by pdkit first."""


def expected_away_s(engine: str, phases: tuple[str, ...] = tuple(PHASES)) -> float:
    """pdkit's figure for how long an instance of `engine` is away over `phases` (seconds,
    `MARGIN` included), when none was measured."""
    return sum(EXPECTED_S[engine][p] for p in phases) * MARGIN


def router_hold_s(router: Router) -> float:
    """How long the router holds a request while its role has no worker (seconds): pdkit's
    `router.faults.hold_timeout_s`; smg holds none."""
    return router.faults.hold_timeout_s if router.kind == "pdkit" else 0.0


def only_instance_warnings(topology: Topology, placed: Placement) -> list[Problem]:
    """Per role with one instance spanning more than one node, when the restart of its rank
    group (`UNPLANNED`, pdkit's figure for the engine) outlasts the router's hold."""
    away_s = expected_away_s(topology.engine, UNPLANNED)
    hold_s = router_hold_s(topology.router)
    if away_s <= hold_s:
        return []
    needed = math.ceil(away_s)
    if topology.router.kind == "pdkit":
        hold = f"{hold_s:g} s, router.faults.hold_timeout_s"
        raise_hold = f"router.faults.hold_timeout_s: {needed} or more"
    else:
        hold = "none: smg holds no request"
        raise_hold = f"router.kind: pdkit with router.faults.hold_timeout_s: {needed} or more"
    found = []
    for role in ROLE_NAMES:
        instances = [p for p in placed.instances if p.role == role]
        if len(instances) != 1 or instances[0].nnodes == 1:
            continue
        found.append(
            Problem(
                (role,),
                f"its only instance spans {instances[0].nnodes} nodes; when one rank dies the "
                f"whole instance restarts (about {away_s:.0f} s for {topology.engine}, pdkit's "
                f"figure), longer than the router's hold ({hold}): requests for {role} fail "
                "meanwhile.",
                f"set {role}.count: 2 (the other serves meanwhile), or {raise_hold}.",
            )
        )
    return found
