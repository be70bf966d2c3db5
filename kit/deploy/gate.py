"""The KV transfer gate: the last stage of `pdkit up`, and `pdkit doctor`.

Readiness only says that every worker answers `/health`, which moves no KV. The gate sends one
real PD request to every prefill x decode pair (`kit.observe.doctor`): greedy and fixed, so every
pair must give the same tokens (and a colocated reference server's, `DoctorOptions.reference_url`).
It fails `pdkit up` with the pair, what was seen (for wrong tokens: what it gave against the
reference's or the majority's) and the cause found in both workers' logs, read here the way
`pdkit logs` reads them (local file, or `tail` over SSH).
"""

from __future__ import annotations

import shlex

from rich.console import Console

from kit.errors import DeployError
from kit.hosts.context import DeployContext
from kit.hosts.logs import tail
from kit.hosts.pool_check import check_pool
from kit.observe.doctor import LOG_LINES, DoctorOptions, LogReader
from kit.observe.doctor_view import (
    check,
    doctor,
    failure_lines,
    matrix_table,
    summary,
    token_line,
)
from kit.observe.run import ProbeOptions, replica_checks


class GateError(DeployError):
    """The gate failed; `findings` is what failed and why, without the advice for `pdkit up`
    (a caller that runs the gate for another command gives its own)."""

    def __init__(self, message: str, findings: str) -> None:
        super().__init__(message)
        self.findings = findings


def log_reader(ctx: DeployContext, lines: int = LOG_LINES) -> LogReader:
    """process name -> the last `lines` lines of its log on its host."""
    return lambda process: tail(ctx.log_file(process), lines)


def transfer_gate(ctx: DeployContext, console: Console, options: DoctorOptions) -> None:
    """Probe every pair; print the matrix; raise `DeployError` naming each failed pair and its
    cause when one did not move KV."""
    plan = ctx.plan
    pairs = len(plan.role("prefill")) * len(plan.role("decode"))
    console.print(
        f"[bold]Gate[/]: one PD request per prefill x decode pair ({pairs} pair(s), "
        f"timeout {options.timeout_s:g} s each), tokens compared with "
        + (
            f"the reference {options.reference_url}"
            if options.reference_url
            else options.expected_source
            if options.expected is not None
            else "each other"
        )
    )
    matrix = check(plan, options, log_reader(ctx))
    console.print(matrix_table(matrix))
    if matrix.ok:
        for line in (token_line(matrix), summary(matrix)):
            console.print(f"  {line}", style="dim", markup=False, highlight=False)
        return
    topology = shlex.quote(str(ctx.topology_file))
    moved = [p for p in matrix.failed if p.state != "wrong"]
    wrong = [p for p in matrix.failed if p.state == "wrong"]
    what = []
    if moved:
        what.append(f"{len(moved)} did not move KV ({', '.join(p.name for p in moved)})")
    if wrong:
        what.append(f"{len(wrong)} gave wrong tokens ({', '.join(p.name for p in wrong)})")
    if matrix.reference_error:
        what.append("the reference gave no answer")
    findings = [
        f"The KV transfer gate failed: of {len(matrix.pairs)} prefill x decode pair(s), "
        f"{'; '.join(what)}.",
        *failure_lines(matrix),
    ]
    lines = [
        *findings,
        "The workers and the router are running, but requests routed to these pairs fail.",
        f"To fix: correct the cause above, then `pdkit up {topology}` again; "
        f"`pdkit doctor {topology}` re-runs the check alone, and `pdkit up {topology} "
        "--no-gate` deploys without it.",
    ]
    raise GateError("\n".join(lines), "\n".join(findings))


def run_doctor(
    ctx: DeployContext,
    console: Console,
    options: DoctorOptions,
    *,
    as_json: bool = False,
    input_tokens: int,
) -> int:
    """`pdkit doctor`: the exit status (0 when every pair moved KV and, with `kv_pool:`, every
    host with pool clients put and got a page through the pool)."""
    status = doctor(
        ctx.plan, console, options, log_reader(ctx), as_json=as_json, input_tokens=input_tokens
    )
    checks = check_pool(ctx)
    if not as_json:
        for check in checks:
            console.print(check.line(), style="" if check.ok else "red", markup=False)
    replicas = replica_checks(ctx.plan, ProbeOptions())
    if replicas is not None and not as_json:
        for part in (*replicas.replicas, *((replicas.vip,) if replicas.vip else ())):
            console.print(part.line(), style="" if part.ok else "red", markup=False)
        for _, _, cause in replicas.problems:
            console.print(f"  {cause}", style="red", markup=False)
    replicas_ok = replicas is None or not replicas.problems
    return status or (0 if all(c.ok for c in checks) and replicas_ok else 1)
