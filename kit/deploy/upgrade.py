"""`pdkit upgrade`: a running deployment moved to a new SGLang version (`sglang_version`, a host's
`sglang_python`), model revision (`model.revision`) or pdkit release (its templates and
interpreter), one instance at a time, through the path of a live `pdkit up` (`kit.deploy.live`).

    1. the target: the topology of `--to`, resolved with every check; its difference to what
       runs must be replacements only (the same deployment, instances and places: scaling is
       `pdkit up`'s), and the running topology must be what runs (the rollback's target)
    2. the expected answer: the deployment's own to the gate's greedy request (every pair
       agreeing) before anything changes
    3. progress: `<state dir>/upgrade.json` (both topology files, the target's digest, the
       expected answer, the status), written before the first step
    4. the steps (`kit.deploy.live`): a role's only instance with a stand-in on a free GPU,
       else within the router's hold, else refused without --force; any other drained and
       replaced while its role's others serve. Each new instance's pairs must give the expected
       answer (`--reference`'s instead, where the new engine's tokens may differ) before it
       joins the router: the first failure stops the upgrade
    5. a stopped upgrade: every instance already upgraded is replaced back with the running
       topology's by the same path (the failed one stays held by the router meanwhile); the
       reason is raised, with what serves
    6. interrupted (Ctrl-C, a lost control machine): the progress stays; `--resume` goes on from
       what the record says runs, `--rollback` goes back

The record (`kit.deploy.state`) is saved after each instance, so it always says which run the
target's settings: resuming is the same difference again, and so is rolling back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from rich.console import Console
from rich.markup import escape

from kit.deploy.changes import Changes, Step, diff
from kit.deploy.gate import GateError, log_reader
from kit.deploy.live import LiveChange, print_changes
from kit.deploy.state import (
    DeploymentRecord,
    build_record,
    load_record,
    load_starts,
    load_windows,
    templates_digest,
)
from kit.deploy.steps import UpOptions, playbook_secret_env
from kit.deploy.surge import OnlyInstance, StartEstimate, start_estimate
from kit.errors import DeployError, TopologyError
from kit.hosts.context import DeployContext, deployment_lock
from kit.hosts.inventory import deploy_hosts
from kit.hosts.playbook import playbooks_dir
from kit.hosts.state_dir import display_path
from kit.observe.doctor import DoctorOptions
from kit.observe.doctor_tokens import Answer
from kit.observe.doctor_view import check, failure_lines, token_line
from kit.plan.resolve import resolve

PROGRESS_FILE = "upgrade.json"
Mode = Literal["start", "resume", "rollback"]
Status = Literal["running", "rolling back"]
BEFORE = "the answer before the upgrade"
"""How the gate names the expected answer when no --reference is given."""


class UpgradeProgress(BaseModel):
    """An upgrade under way, as `<state dir>/upgrade.json` keeps it (removed once it is done or
    rolled back)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    """The running topology's file (absolute): the rollback's target."""
    target: str
    """`--to`'s file (absolute)."""
    target_digest: str
    """sha256 of the target file's text: `--resume` refuses a file changed since."""
    reference_url: str | None = None
    expected_ids: tuple[int, ...] | None = None
    expected_text: str
    """The deployment's answer to the gate's request before the upgrade (ids and text)."""
    status: Status = "running"
    reason: str = ""
    """Why the upgrade stopped (status `rolling back`)."""

    @property
    def expected(self) -> Answer:
        return Answer(self.expected_ids, self.expected_text)


def progress_path(state_dir: Path) -> Path:
    return state_dir / PROGRESS_FILE


def load_progress(state_dir: Path) -> UpgradeProgress | None:
    """The upgrade under way, or None; a file that cannot be read is an error naming the fix."""
    path = progress_path(state_dir)
    try:
        return UpgradeProgress.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DeployError(
            f"cannot read the upgrade's progress {display_path(path)}: {exc}"
        ) from exc
    except ValidationError as exc:
        raise DeployError(
            f"the upgrade's progress {display_path(path)} is not one this pdkit can read (e.g. "
            f"{exc.errors()[0]['msg']}). To fix: delete "
            "it; `pdkit up TOPOLOGY --diff` then shows which instances run which settings."
        ) from exc


def save_progress(state_dir: Path, progress: UpgradeProgress) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    progress_path(state_dir).write_text(progress.model_dump_json(indent=2) + "\n")


def forget_progress(state_dir: Path) -> None:
    progress_path(state_dir).unlink(missing_ok=True)


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def upgrade_steps(changes: Changes, target: str, known: set[str]) -> tuple[Step, ...]:
    """The steps of an upgrade: replacements, and adds of `known` instances (the running
    topology's: one an interrupted upgrade had stopped); `DeployError` naming whatever else
    `target` changes."""
    other = [
        s.describe()
        for s in changes.steps
        if s.kind == "remove" or (s.kind == "add" and s.instance not in known)
    ]
    if other:
        raise DeployError(
            f"--to {target} changes more than an upgrade does: {'; '.join(other)}. Nothing was "
            "changed. To fix: keep prefill.count, decode.count and the hosts as they run in "
            "--to's file (change them with `pdkit up` before or after the upgrade)."
        )
    return changes.steps


@dataclass(frozen=True)
class StepPlan:
    """One replacement of an upgrade as `--dry-run` shows it: how its role is covered and how
    long (seconds) the role runs below its instance count meanwhile."""

    step: Step
    count: int
    """Instances of the role in the topology."""
    estimate: StartEstimate
    cover: OnlyInstance | None = None
    """How it is covered when it is its role's only instance."""

    @property
    def below_s(self) -> float:
        """Seconds its role runs below its count: none with a stand-in, else its time away."""
        if self.cover is not None and self.cover.path == "surge":
            return 0.0
        return self.estimate.seconds

    def line(self, number: int) -> str:
        step = self.step
        head = f"{number}. {step.describe()}"
        if self.cover is not None and self.cover.path == "surge":
            return f"{head}: {self.cover.line()}; the {step.role}s stay at {self.count}"
        serving = self.count - 1
        how = (
            f"the router holds the {step.role}s' requests meanwhile"
            if self.cover is not None and self.cover.path == "hold"
            else "requests fail past the router's hold (--force)"
            if self.cover is not None
            else f"{serving} other {step.role}(s) serve"
        )
        return (
            f"{head}: the {step.role}s at {serving} of {self.count} for about "
            f"{self.estimate.seconds:.0f} s ({how}; {self.estimate.source})"
        )


def step_plans(
    steps: tuple[Step, ...],
    counts: dict[str, int],
    estimates: dict[str, StartEstimate],
    covers: dict[str, OnlyInstance],
) -> list[StepPlan]:
    """The steps with their estimates (by instance) and covers (by instance, only instances)."""
    return [
        StepPlan(s, counts.get(s.role, 1), estimates[s.instance], covers.get(s.instance))
        for s in steps
    ]


def below_count(plans: list[StepPlan]) -> dict[str, float]:
    """Seconds each role runs below its instance count over the whole upgrade (one at a time)."""
    out: dict[str, float] = {}
    for plan in plans:
        out[plan.step.role] = out.get(plan.step.role, 0.0) + plan.below_s
    return out


def target_context(source: DeployContext, target_file: Path) -> DeployContext:
    """The context of `--to`'s topology on the running deployment's state dir; `DeployError`
    when it is another deployment or puts its files elsewhere on a host."""
    try:
        plan = resolve(target_file, state_base=source.state_dir.parent)
    except TopologyError as exc:
        raise DeployError(f"--to {target_file}: {exc}") from exc
    if plan.name != source.plan.name:
        raise DeployError(
            f"--to {target_file} is deployment {plan.name}, the running one is "
            f"{source.plan.name}. To fix: set `name: {source.plan.name}` in --to's file."
        )
    hosts = deploy_hosts(plan, sys.executable)
    roots = {h.name: h.layout.root for h in source.hosts}
    moved = [h.name for h in hosts if roots.get(h.name, h.layout.root) != h.layout.root]
    if moved:
        raise DeployError(
            f"--to {target_file} puts the files of host(s) {', '.join(moved)} under another "
            "root than the running deployment (a relative hosts[].root is taken from the "
            "topology file's folder). To fix: put --to's file beside the running one, or give "
            "hosts[].root as an absolute path."
        )
    return DeployContext(target_file, plan, source.state_dir, hosts)


def _record(ctx: DeployContext) -> DeploymentRecord:
    return build_record(ctx.plan, ctx.hosts, templates_digest(playbooks_dir(ctx.private_dir)))


def upgrade(
    source: DeployContext,
    target_file: Path | None,
    console: Console,
    options: UpOptions,
    *,
    reference_url: str | None = None,
    dry_run: bool = False,
    mode: Mode = "start",
) -> None:
    """Move the deployment of `source` (its running topology) to `target_file`'s (see the
    module doc); `mode` resume or rollback goes on with, or back from, an interrupted one."""
    with deployment_lock(source):
        state = source.state_dir
        topology = shlex.quote(str(source.topology_file))
        recorded = load_record(state)
        if recorded is None:
            raise DeployError(
                f"nothing of deployment {source.plan.name} is recorded as running, so there is "
                f"nothing to upgrade. To fix: `pdkit up {topology}` (a first deploy is already "
                "on whatever the topology pins)."
            )
        progress = load_progress(state)
        target_file = _target_file(source, progress, target_file, mode)
        if mode == "rollback":
            assert progress is not None
            _roll_back(source, console, options, progress, dry_run=dry_run)
            return
        target = target_context(source, target_file)
        target_record = _record(target)
        forward = diff(recorded, target_record)
        steps = upgrade_steps(forward, str(target_file), set(_record(source).instances()))
        # A new pdkit release on the same file: nothing older to go back to.
        same_file = target_file.resolve() == source.topology_file.resolve()
        if mode == "start" and not same_file:
            _check_source(source, recorded, topology)
        console.print(
            f"[bold]pdkit upgrade {escape(source.plan.name)}[/]: "
            f"{escape(display_path(source.topology_file))} -> "
            f"{escape(display_path(target_file))}, one instance at a time"
            f"{' (resumed)' if mode == 'resume' else ''}"
        )
        if dry_run:
            _dry_run(
                target,
                console,
                options,
                forward=forward,
                recorded=recorded,
                target_record=target_record,
            )
            return
        if not steps and forward.nothing:
            forget_progress(state)
            console.print("Nothing to upgrade: every process runs with --to's settings.")
            return
        if progress is None:
            expected = _expected_answer(source, console, options)
            progress = UpgradeProgress(
                source=str(source.topology_file.absolute()),
                target=str(target_file.absolute()),
                target_digest=file_digest(target_file),
                reference_url=reference_url,
                expected_ids=expected.output_ids,
                expected_text=expected.text,
            )
            save_progress(state, progress)
        print_changes(console, forward)
        gate = _gate_options(options, progress, forward=True)
        live = LiveChange(
            target,
            console,
            dataclasses.replace(options, gate=True, gate_options=gate),
            playbook_secret_env(target),
            target_record,
            gate_with_running=True,
            hold_on_failure=not same_file,
        )
        try:
            live.apply(forward, recorded)
        except KeyboardInterrupt:
            raise DeployError(_interrupted(source, target_file)) from None
        except DeployError as exc:
            raise _stopped(
                source,
                console,
                options,
                progress,
                exc=exc,
                target_record=target_record,
                same_file=same_file,
            ) from exc
        forget_progress(state)
        new = shlex.quote(str(target_file))
        console.print(
            f"Upgraded: every instance runs {escape(display_path(target_file))}'s settings. "
            f"It is the deployment's topology from now on (`pdkit status {escape(new)}`, "
            f"`pdkit up {escape(new)}`).",
        )


def _stopped(
    source: DeployContext,
    console: Console,
    options: UpOptions,
    progress: UpgradeProgress,
    *,
    exc: DeployError,
    target_record: DeploymentRecord,
    same_file: bool,
) -> DeployError:
    """A failed step: the upgraded instances rolled back (none for a release on the same file),
    and the error that says why and what serves."""
    state = source.state_dir
    topology = shlex.quote(str(source.topology_file))
    target = Path(progress.target)
    reason = _reason(exc)
    if same_file:
        forget_progress(state)
        return DeployError(
            f"{reason}\nThe upgrade stopped there. Nothing to roll back to: the instances "
            "already replaced run this pdkit's files, and the old release's are gone. To "
            f"fix: correct the cause above, then `pdkit upgrade {topology} --to "
            f"{topology}` again (or install the old pdkit again and `pdkit up {topology}`)."
        )
    now = load_record(state)
    away = [n for n in target_record.instances() if now and n not in now.instances()]
    at = f" at {', '.join(away)}" if away else ""
    console.print(
        f"[bold red]The upgrade stopped{escape(at)}[/] ({escape(reason.splitlines()[0])}): "
        f"rolling the upgraded instances back to {escape(display_path(source.topology_file))}"
    )
    stopped = progress.model_copy(update={"status": "rolling back", "reason": reason})
    save_progress(state, stopped)
    try:
        _roll_back(source, console, options, stopped)
    except DeployError as again:
        return DeployError(
            f"{reason}\nThe upgrade stopped{at}, and its rollback failed too: {again}\n"
            f"To fix: correct that, then `pdkit upgrade {topology} --rollback` finishes the "
            "rollback."
        )
    return DeployError(
        f"{reason}\nThe upgrade to {display_path(target)} stopped{at} and was rolled back: "
        f"every instance runs {display_path(source.topology_file)}'s settings again and the "
        "deployment serves as before. To fix: correct the cause above, then "
        f"`pdkit upgrade {topology} --to {shlex.quote(display_path(target))}` again."
    )


def _reason(exc: DeployError) -> str:
    """Why a step failed: a failed gate's findings (its advice is `pdkit up`'s, not ours)."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, GateError):
        cause = cause.__cause__
    return cause.findings if isinstance(cause, GateError) else str(exc)


def _target_file(
    source: DeployContext, progress: UpgradeProgress | None, target_file: Path | None, mode: Mode
) -> Path:
    """`--to`'s file, checked against the progress of an upgrade under way."""
    topology = shlex.quote(str(source.topology_file))
    if progress is None:
        if mode != "start":
            raise DeployError(
                f"no upgrade of deployment {source.plan.name} is under way (no "
                f"{display_path(progress_path(source.state_dir))}), so there is nothing to "
                f"{'resume' if mode == 'resume' else 'roll back'}. To fix: `pdkit upgrade "
                f"{topology} --to NEW.yaml` starts one."
            )
        if target_file is None:
            raise DeployError(
                "pdkit upgrade needs the topology to move to. To fix: copy the running topology, "
                "change what the upgrade changes (sglang_version and hosts[].sglang_python for "
                "an SGLang version, model.revision for a model revision; the same file after "
                f"installing a new pdkit release) and pass it: `pdkit upgrade {topology} --to "
                "NEW.yaml`."
            )
        return target_file
    recorded = Path(progress.target)
    if mode == "start":
        what = "stopped while rolling back" if progress.status == "rolling back" else "interrupted"
        raise DeployError(
            f"an upgrade of deployment {source.plan.name} to {display_path(recorded)} was "
            f"{what}. To fix: `pdkit upgrade {topology} --resume` goes on with it, "
            f"`pdkit upgrade {topology} --rollback` goes back to {topology}'s settings."
        )
    if target_file is not None and target_file.absolute() != recorded:
        raise DeployError(
            f"--to {target_file} is not the upgrade under way (to {recorded}). To fix: leave "
            "--to out with --resume or --rollback."
        )
    if Path(progress.source) != source.topology_file.absolute():
        raise DeployError(
            f"the upgrade under way started from {progress.source}, not {source.topology_file}. "
            f"To fix: `pdkit upgrade {shlex.quote(progress.source)} --{mode}`."
        )
    if mode == "resume" and progress.status == "rolling back":
        raise DeployError(
            f"the upgrade to {display_path(recorded)} stopped ({progress.reason.splitlines()[0]}) "
            f"and was rolling back. To fix: `pdkit upgrade {topology} --rollback` finishes that."
        )
    if mode == "resume" and (
        not recorded.exists() or file_digest(recorded) != progress.target_digest
    ):
        raise DeployError(
            f"{recorded} changed (or is gone) since the upgrade started, so resuming would move "
            f"the rest elsewhere than the upgraded instances. To fix: restore it, or `pdkit "
            f"upgrade {topology} --rollback` and start again."
        )
    return recorded


def _check_source(source: DeployContext, recorded: DeploymentRecord, topology: str) -> None:
    """The running topology must be what runs: it is what a rollback goes back to."""
    back = diff(recorded, _record(source))
    if back.steps:
        raise DeployError(
            f"{topology} is not what runs ({'; '.join(s.describe() for s in back.steps)}), and "
            "an upgrade rolls back to it. Nothing was changed. To fix: `pdkit up "
            f"{topology}` first (`--diff` shows the difference), or name the topology that runs."
        )


def _expected_answer(ctx: DeployContext, console: Console, options: UpOptions) -> Answer:
    """The deployment's answer to the gate's request before anything changes (every pair
    agreeing on it); `DeployError` when it does not pass its own gate."""
    console.print("[bold]Before[/]: the gate's request to every prefill x decode pair")
    gate = DoctorOptions(timeout_s=options.gate_options.timeout_s)
    matrix = check(ctx.plan, gate, log_reader(ctx))
    want = matrix.expected
    if matrix.ok and want is not None and want.answer is not None:
        console.print(f"  {token_line(matrix)}", style="dim", markup=False, highlight=False)
        return want.answer
    topology = shlex.quote(str(ctx.topology_file))
    raise DeployError(
        "\n".join(
            [
                "the deployment does not pass its own gate before the upgrade, so no answer "
                "can tell a good upgraded instance from a bad one. Nothing was changed.",
                *failure_lines(matrix),
                f"To fix: `pdkit doctor {topology}` shows it; fix that first.",
            ]
        )
    )


def _gate_options(options: UpOptions, progress: UpgradeProgress, *, forward: bool) -> DoctorOptions:
    """Each new instance's pairs give `--reference`'s answer (forward only: a rollback goes back
    to the old engine), else the deployment's answer before the upgrade."""
    base = options.gate_options
    if forward and progress.reference_url:
        return dataclasses.replace(base, reference_url=progress.reference_url, expected=None)
    return dataclasses.replace(
        base, reference_url=None, expected=progress.expected, expected_source=BEFORE
    )


def _roll_back(
    source: DeployContext,
    console: Console,
    options: UpOptions,
    progress: UpgradeProgress,
    *,
    dry_run: bool = False,
) -> None:
    """Every instance not running `source`'s settings replaced back (`kit.deploy.live`, forced
    past the hold: going back beats staying half upgraded); the progress removed after."""
    recorded = load_record(source.state_dir)
    assert recorded is not None
    source_record = _record(source)
    back = diff(recorded, source_record)
    console.print(
        f"[bold]Rollback[/]: back to {escape(display_path(source.topology_file))}'s settings"
    )
    print_changes(console, back)
    if dry_run:
        console.print("Nothing was changed (--dry-run).")
        return
    gate = _gate_options(options, progress, forward=False)
    live = LiveChange(
        source,
        console,
        dataclasses.replace(options, gate=True, gate_options=gate, force=True),
        playbook_secret_env(source),
        source_record,
        gate_with_running=True,
        hold_on_failure=True,
    )
    try:
        live.apply(back, recorded)
    except KeyboardInterrupt:
        raise DeployError(_interrupted(source, Path(progress.target))) from None
    forget_progress(source.state_dir)
    console.print(
        f"Rolled back: every instance runs {escape(display_path(source.topology_file))}'s settings."
    )


def _interrupted(source: DeployContext, target: Path) -> str:
    topology = shlex.quote(str(source.topology_file))
    return (
        f"the upgrade to {display_path(target)} was interrupted; the record says which "
        f"instances run which settings (`pdkit up {topology} --diff`). To fix: `pdkit upgrade "
        f"{topology} --resume` goes on, `pdkit upgrade {topology} --rollback` goes back."
    )


def _dry_run(
    target: DeployContext,
    console: Console,
    options: UpOptions,
    *,
    forward: Changes,
    recorded: DeploymentRecord,
    target_record: DeploymentRecord,
) -> None:
    """The steps, how each role is covered and how long it runs below its count."""
    live = LiveChange(target, console, options, {}, target_record)
    console.print("[bold]Steps[/] (one instance at a time; each gated on its tokens):")
    try:
        covers = {c.step.instance: c for c in live.cover_only_instances(forward, recorded)}
    except DeployError as exc:
        console.print(f"  pdkit upgrade would refuse: {exc}", style="yellow", markup=False)
        covers = {}
    measured = load_starts(target.state_dir)
    windows = load_windows(target.state_dir)
    engine = target.plan.engine
    estimates = {
        s.instance: start_estimate(s.instance, engine, measured, windows) for s in forward.steps
    }
    plans = step_plans(forward.steps, forward.serving, estimates, covers)
    for number, plan in enumerate(plans, 1):
        console.print(f"  {plan.line(number)}", markup=False, highlight=False)
    extra = len(plans)
    if forward.router:
        extra += 1
        console.print(
            f"  {extra}. the router: {'handed over' if forward.router_handover else 'restarted'} "
            f"({'; '.join(forward.router)})",
            markup=False,
            highlight=False,
        )
    if not plans and not forward.router:
        console.print("  none: every process runs with --to's settings", markup=False)
    below = below_count(plans)
    console.print("[bold]Below its count[/] (the sum of the steps' estimates):")
    for role in ("prefill", "decode"):
        count = forward.serving.get(role, 0)
        console.print(
            f"  {role} ({count} instance{'s' if count != 1 else ''}): about "
            f"{below.get(role, 0.0):.0f} s",
            markup=False,
            highlight=False,
        )
    console.print("Nothing was changed (--dry-run).")
