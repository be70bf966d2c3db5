"""What `pdkit doctor` (and `pdkit up`'s gate) shows: the P x D matrix, each failed pair with its
cause and fix, and the KV cost of the topology's model against the TTFT objective.

The KV cost is the PD survey's arithmetic: bytes per token = 2 (K and V) x layers x KV heads x
head dim x 2 bytes (16-bit KV), times the input length, over the measured per-rank bandwidth
times the ranks that send in parallel (the prefill's attention-TP GPUs, one NIC each). OPT-175B
(4.5 MB per token) at 2048 tokens over 8 x 64 GB/s takes about 18 ms.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kit.errors import PdkitError
from kit.observe.doctor import (
    DoctorOptions,
    LogReader,
    Matrix,
    PairResult,
    explain,
    run_matrix,
    shorten,
)
from kit.observe.doctor_logs import finding_lines, log_findings
from kit.topology.plan_types import Plan

DEFAULT_INPUT_TOKENS = 2048
KV_DTYPE_BYTES = 2.0  # SGLang's kv-cache-dtype auto on 16-bit models


@dataclass(frozen=True)
class KvCost:
    """The model's KV per token and what moving `tokens` of it costs at the measured speed.
    `speed_gb_s` is the mean per-rank speed the prefills reported (None: nothing measured),
    `ranks` the prefill's attention-TP GPUs sending in parallel; times in ms."""

    model: str
    bytes_per_token: float
    tokens: int
    speed_gb_s: float | None
    ranks: int
    ttft_ms: float

    @property
    def total_bytes(self) -> float:
        return self.bytes_per_token * self.tokens

    @property
    def transfer_ms(self) -> float | None:
        if not self.speed_gb_s:
            return None
        return self.total_bytes / (self.speed_gb_s * 1e9 * self.ranks) * 1000

    def line(self) -> str:
        size = _bytes(self.bytes_per_token)
        text = (
            f"KV cost: {self.model}: {size} per token (16-bit KV); {self.tokens} input tokens "
            f"= {_bytes(self.total_bytes)}"
        )
        took = self.transfer_ms
        if took is None:
            return f"{text}; no transfer measured, so no time to compare with the TTFT objective."
        share = took / self.ttft_ms
        return (
            f"{text}, at the measured {self.speed_gb_s:.3g} GB/s per rank x {self.ranks} "
            f"rank(s): {took:.1f} ms, {share:.0%} of the TTFT objective ({self.ttft_ms:g} ms)"
        )


def kv_cost(plan: Plan, matrix: Matrix, tokens: int) -> KvCost | str:
    """The KV cost of `plan`'s model, or why it cannot be computed (an unknown model)."""
    from kit.perf.models import resolve_model  # noqa: PLC0415 (model lookups read files)

    try:
        shape = resolve_model(plan.model.path)
    except PdkitError as exc:
        return f"KV cost: unknown for {plan.model.path} ({exc})."
    speeds = [p.transfer.speed_gb_s for p in matrix.pairs if p.transfer and p.transfer.count]
    prefill = plan.role("prefill")
    ranks = prefill[0].parallelism.attn_tp if prefill else 1
    return KvCost(
        model=shape.name,
        bytes_per_token=shape.kv_bytes_per_token(KV_DTYPE_BYTES),
        tokens=tokens,
        speed_gb_s=sum(speeds) / len(speeds) if speeds else None,
        ranks=ranks,
        ttft_ms=plan.slo.ttft_ms,
    )


def _bytes(value: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


# -- text ---------------------------------------------------------------------------------


def cell(pair: PairResult) -> Text:
    """One matrix cell: ok with TTFT and the transfer, or the failure in a word or two."""
    if pair.ok:
        text = Text("ok", style="green")
        text.append(f" TTFT {pair.ttft_ms:.0f} ms")
        if pair.transfer:
            t = pair.transfer
            text.append(f"\nKV {t.latency_ms:.1f} ms {t.speed_gb_s:.3g} GB/s", style="dim")
        else:
            text.append("\nKV figures not reported", style="dim")
        return text
    labels = {"failed": "FAILED", "timeout": "TIMEOUT", "skipped": "skipped"}
    label = labels.get(pair.state, "WRONG TOKENS")
    text = Text(label, style="yellow" if pair.state == "skipped" else "bold red")
    if pair.causes:
        text.append(f"\n{pair.causes[0].signature.name}")
    return text


def matrix_table(matrix: Matrix) -> Table:
    """Prefills in rows, decodes in columns."""
    table = Table(
        title=f"KV transfer, prefill x decode ({len(matrix.prefills)} x {len(matrix.decodes)})",
        title_justify="left",
        show_lines=True,
    )
    table.add_column("prefill \\ decode", style="bold")
    for d in matrix.decodes:
        table.add_column(d.name)
    for p in matrix.prefills:
        table.add_row(p.name, *(cell(matrix.pair(p.name, d.name)) for d in matrix.decodes))
    return table


def failure_lines(matrix: Matrix) -> list[str]:
    """Per failed pair: what was seen, then each cause with its fix and the line it came from,
    or, for an unknown failure, the log lines that matter."""
    lines: list[str] = []
    if matrix.reference_error:
        lines.append(f"token check: {matrix.reference_error}")
    for pair in matrix.failed:
        lines.append(f"{pair.name}: {pair.state}: {pair.symptom}")
        if pair.state == "wrong":
            lines.append(f"  cause: {WRONG_TOKENS_CAUSE}")
        for match in pair.causes:
            s = match.signature
            lines.append(f"  cause ({s.name}): {s.cause}. To fix: {s.fix}.")
            lines.append(f"    {match.where}: {shorten(match.line, 240)}")
        if pair.causes or pair.state == "skipped":
            continue
        if pair.state == "timeout":
            lines.append(
                f"  cause: no known log line yet: the request did not finish within "
                f"{matrix.timeout_s:g} s (SGLang itself gives up after "
                "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT / _WAITING_TIMEOUT, 300 s). A transfer "
                "that hangs is usually packets dropped between the NICs: a firewall on the "
                "Mooncake ports (15000-17000), a NIC on the wrong rail, a wrong GID index."
            )
        else:
            lines.append("  cause: not a known log signature.")
        if pair.evidence:
            lines.append("  the log lines that matter:")
            lines += [f"    {shorten(line, 240)}" for line in pair.evidence]
        else:
            lines.append(f"  no error lines in the logs of {pair.prefill} and {pair.decode}.")
    return lines


WRONG_TOKENS_CAUSE = (
    "the KV moved but the decode's tokens are not the prefill's continuation: KV written into "
    "the wrong pages or altered on the way (page size, KV dtype or layout differing between "
    "the roles, a bad NIC, PCIe or GPUDirect path), or a worker running another model or "
    "version. SGLang writes no line for it unless both roles run with "
    "--disaggregation-enable-kv-checksum. To fix: compare both roles' model, page size and KV "
    "dtype (`pdkit render T --json`), then test the rails (`pdkit provision T --transfer-test`)"
)


def token_line(matrix: Matrix) -> str:
    """What the token check compared against, and how many pairs agreed."""
    want = matrix.expected
    if matrix.reference_error or want is None:
        return "tokens: not checked"
    if want.compared == 0:
        return "tokens: no pair answered, nothing to compare"
    if want.answer is None:
        return f"tokens: the pairs disagree and none has a majority ({want.source})"
    where = f" {matrix.reference_url}" if matrix.reference_url else ""
    if want.compared == 1 and want.source.startswith("the majority"):
        return f"tokens: {want.answer.show()} (one pair: no other answer to compare with)"
    return (
        f"tokens: {want.agree} of {want.compared} pair(s) agree with {want.source}{where}: "
        f"{want.answer.show()}"
    )


def summary(matrix: Matrix) -> str:
    moved = sum(p.ok or p.state == "wrong" for p in matrix.pairs)
    wrong = sum(p.state == "wrong" for p in matrix.pairs)
    text = (
        f"{moved} of {len(matrix.pairs)} pair(s) moved KV ({len(matrix.prefills)} prefill x "
        f"{len(matrix.decodes)} decode) in {matrix.seconds:.1f} s"
    )
    return f"{text}; {wrong} of them gave wrong tokens" if wrong else text


def matrix_to_json(matrix: Matrix, cost: KvCost | str | None) -> dict[str, Any]:
    def pair(p: PairResult) -> dict[str, Any]:
        return {
            "prefill": p.prefill,
            "decode": p.decode,
            "state": p.state,
            "ttft_ms": p.ttft_ms,
            "answer_ms": p.answer_ms,
            "output_ids": list(p.answer.output_ids or ()) if p.answer else None,
            "output_text": p.answer.text if p.answer else None,
            "kv_transfer_ms": p.transfer.latency_ms if p.transfer else None,
            "kv_speed_gb_s": p.transfer.speed_gb_s if p.transfer else None,
            "kv_transfers": p.transfer.count if p.transfer else 0,
            "bootstrap_rooms": list(p.rooms),
            "symptom": p.symptom,
            "causes": [
                {
                    "name": m.signature.name,
                    "cause": m.signature.cause,
                    "fix": m.signature.fix,
                    "line": m.line,
                    "where": m.where,
                }
                for m in p.causes
            ],
            "evidence": list(p.evidence),
        }

    kv: dict[str, Any] | str | None
    if isinstance(cost, KvCost):
        kv = {
            "model": cost.model,
            "bytes_per_token": cost.bytes_per_token,
            "input_tokens": cost.tokens,
            "speed_gb_s": cost.speed_gb_s,
            "ranks": cost.ranks,
            "transfer_ms": cost.transfer_ms,
            "ttft_objective_ms": cost.ttft_ms,
        }
    else:
        kv = cost
    return {
        "deployment": matrix.deployment,
        "ok": matrix.ok,
        "seconds": round(matrix.seconds, 3),
        "timeout_s": matrix.timeout_s,
        "prefills": [p.name for p in matrix.prefills],
        "decodes": [d.name for d in matrix.decodes],
        "pairs": [pair(p) for p in matrix.pairs],
        "tokens": _tokens_json(matrix),
        "kv_cost": kv,
    }


def _tokens_json(matrix: Matrix) -> dict[str, Any]:
    want = matrix.expected
    answer = want.answer if want is not None else None
    return {
        "reference": matrix.reference_url,
        "reference_error": matrix.reference_error or None,
        "expected_source": want.source if want is not None else None,
        "expected_ids": list(answer.output_ids or ()) if answer is not None else None,
        "expected_text": answer.text if answer is not None else None,
        "agree": want.agree if want is not None else 0,
        "compared": want.compared if want is not None else 0,
    }


def check(plan: Plan, options: DoctorOptions, read_log: LogReader) -> Matrix:
    """Run the matrix and explain its failures (the caller's `read_log` tails the logs)."""
    matrix = asyncio.run(run_matrix(plan, options))
    return explain(matrix, read_log) if not matrix.ok else matrix


def show(
    matrix: Matrix, console: Console, cost: KvCost | str | None = None, plain: bool = False
) -> None:
    """The table, the failures and the KV cost; `plain` writes lines only (no table)."""
    write: Callable[[str], None] = lambda text: console.print(  # noqa: E731
        text, markup=False, highlight=False, soft_wrap=True
    )
    if not plain:
        console.print(matrix_table(matrix))
    for line in failure_lines(matrix):
        write(line)
    write(token_line(matrix))
    if cost is not None:
        write(cost.line() if isinstance(cost, KvCost) else cost)
    write(summary(matrix))


def doctor(
    plan: Plan,
    console: Console,
    options: DoctorOptions,
    read_log: LogReader,
    *,
    as_json: bool = False,
    input_tokens: int = DEFAULT_INPUT_TOKENS,
) -> int:
    """`pdkit doctor`: probe, explain, print (table or JSON); exit status 0 when every pair
    moved KV and gave the expected tokens."""
    matrix = check(plan, options, read_log)
    cost = kv_cost(plan, matrix, input_tokens)
    findings = log_findings(plan, read_log)
    if as_json:
        data = matrix_to_json(matrix, cost)
        data["log_findings"] = [
            {
                "process": f.process,
                "name": f.match.signature.name,
                "count": f.count,
                "line": f.match.line,
                "fix": f.lines(matrix.ok)[1].strip().removeprefix("To fix: "),
            }
            for f in findings
        ]
        text = json.dumps(data, indent=2)
        console.print(text, markup=False, highlight=False, soft_wrap=True)
    else:
        show(matrix, console, cost)
        for line in finding_lines(findings, matrix.ok):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    return 0 if matrix.ok else 1
