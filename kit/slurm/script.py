"""The Plan as one Slurm batch script: one allocation, one job step per instance.

What the script does, in order, once Slurm runs it on the allocation's first node:
1. Names the nodes it got, in order: the topology's node0 is the first of $SLURM_JOB_NODELIST.
2. Asks each node for its address (a step on the node: `hostname -I`, the first one) and writes
   `<root>/job-<id>.nodes` (name and address per line), which `pdkit up` reads.
3. Starts one step per instance with `srun --overlap` on its nodes, one task per node: each
   task runs the launch line of its node rank, exactly as `pdkit render` prints it for Ansible,
   with every node address the Plan holds as a placeholder (kit/topology/slurm_schema.py)
   replaced by that node's resolved address. A step that ends while the job runs is started
   again after 2 s (what supervisord does on a host); a multi-node instance lives and dies as
   one step. Then the router, a step on its node.
4. Waits: the job lasts until `scancel` (pdkit down) or its time limit, starting the steps
   `pdkit up` adds while it runs (a changed instance count, kit/slurm/scale.py).
Between 2 and 3, under `pdkit up`, it waits for pdkit's host checks on every node (`go_file`).

Rendering is pure: the same Plan gives the same script, byte for byte.
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath

from kit.topology.plan_types import Command, Plan
from kit.topology.slurm_schema import PLACEHOLDER_PREFIX, Slurm

RESTART_DELAY_S = 2
HOLD_ENV = "PDKIT_HOLD_S"
"""Set in the job's environment by `pdkit up`: the job waits up to this many seconds for the
go file (`go_file`) before it starts any process. A script submitted by hand does not wait."""
_PLACEHOLDER = re.compile(re.escape(PLACEHOLDER_PREFIX) + r"(\d+)\.(\d+)(?!\d)")


def node_var(index: int) -> str:
    return f"PDKIT_NODE_{index}"


def address_var(index: int) -> str:
    return f"PDKIT_ADDR_{index}"


def job_name(plan: Plan) -> str:
    """The job's name in squeue: pdkit-<deployment>."""
    return f"pdkit-{plan.name}"


def nodes_file(slurm: Slurm, job_id: str) -> str:
    """Where the job writes the nodes it got (name and address per line)."""
    return str(PurePosixPath(slurm.root, f"job-{job_id}.nodes"))


def go_file(slurm: Slurm, job_id: str) -> str:
    """What `pdkit up` writes once the host checks passed on every node: the job's processes
    start then (`HOLD_ENV`)."""
    return str(PurePosixPath(slurm.root, f"job-{job_id}.go"))


def steps_dir(slurm: Slurm, job_id: str) -> str:
    """The folder through which `pdkit up` adds and removes steps of the running job."""
    return str(PurePosixPath(slurm.root, f"job-{job_id}.steps"))


def output_file(slurm: Slurm, job_id: str = "%j") -> str:
    """The batch script's own output (sbatch --output)."""
    return str(PurePosixPath(slurm.root, f"job-{job_id}.out"))


def _node_index(match: re.Match[str]) -> int:
    return int(match.group(1)) * 250 + int(match.group(2)) - 1


def shell_word(arg: str) -> str:
    """`arg` as one shell word; a placeholder address in it becomes its node's variable."""
    if not _PLACEHOLDER.search(arg):
        return shlex.quote(arg)
    out, last = ['"'], 0
    for match in _PLACEHOLDER.finditer(arg):
        out.append(re.sub(r'([\\"$`])', r"\\\1", arg[last : match.start()]))
        out.append("${" + address_var(_node_index(match)) + "}")
        last = match.end()
    out.append(re.sub(r'([\\"$`])', r"\\\1", arg[last:]))
    out.append('"')
    return "".join(out)


def launch_line(command: Command, env: dict[str, str], python: str = "python") -> str:
    """`exec env K=V ... ARGV`: one process's launch, its secret arguments from the env."""
    words = ["exec", "env", *(f"{k}={shell_word(v)}" for k, v in env.items())]
    if len(words) == 2:
        words.pop()
    words += [shell_word(a) for a in command.argv(python)]
    words += [f'{flag} "${name}"' for flag, name in command.secret_args]
    return " ".join(words)


def sbatch_options(plan: Plan, slurm: Slurm) -> list[str]:
    """The #SBATCH options of the deployment's job (also what `pdkit up` submits)."""
    options = [f"--job-name={job_name(plan)}", f"--nodes={slurm.nodes}"]
    options += ["--ntasks-per-node=1", f"--time={slurm.time_limit}"]
    if slurm.gpus_per_node:
        options.append(f"--gpus-per-node={slurm.gpus_per_node}")
    for flag, value in (
        ("--partition", slurm.partition),
        ("--account", slurm.account),
        ("--constraint", slurm.constraint),
        ("--nodelist", ",".join(slurm.nodelist) or None),
    ):
        if value:
            options.append(f"{flag}={value}")
    options += [f"--output={output_file(slurm)}", *slurm.sbatch_args]
    return options


def _preflight(plan: Plan, slurm: Slurm, container: str) -> list[str]:
    """A step on every node before any process starts: the Python environment the workers
    use (pdkit, and SGLang for engine sglang) and, with GPUs, that Slurm gave the node its
    GPUs. A node that fails ends the job, its reason in the job's output."""
    pythons = [("python", "kit")]
    if plan.engine == "sglang":
        pythons.append((next((w.python for w in plan.workers if w.python), "python"), "sglang"))
    lines = [
        "# 2b. Preflight on every node: the workers' Python environment and the node's GPUs.",
        "pdkit_preflight() {",
        '  local where="pdkit: preflight on $SLURMD_NODENAME"',
    ]
    for python, module in pythons:
        word = shlex.quote(python)
        lines.append(
            f'  {word} -c "import {module}" 2>/dev/null || {{ echo "$where: $(command -v {word} '
            f'|| echo no {word}) cannot import {module}"; return 1; }}'
        )
    if slurm.gpus_per_node:
        lines += [
            '  local gpus=$(tr , "\\n" <<<"${CUDA_VISIBLE_DEVICES:-}" | grep -c .)',
            f'  [ "$gpus" -ge {slurm.gpus_per_node} ] || {{ echo "$where: $gpus GPU(s) '
            f"visible, {slurm.gpus_per_node} wanted "
            '(CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-})"; return 1; }',
        ]
    lines += [
        "}",
        "export -f pdkit_preflight",
        f"srun --overlap{container} --nodes={slurm.nodes} --ntasks={slurm.nodes} "
        '--ntasks-per-node=1 bash -c pdkit_preflight || { echo "pdkit: preflight failed; '
        'nothing was started"; exit 1; }',
    ]
    return lines


def _function_name(process: str) -> str:
    return "pdkit_" + re.sub(r"[^A-Za-z0-9]", "_", process)


def _step(name: str, nodes: list[int], ranks: list[str], *, replaceable: bool = False) -> list[str]:
    """A bash function running the launch line of the node it runs on, exported to the step,
    and the restart loop that starts it as one step over `nodes`. `replaceable`: a newer
    launch that `pdkit up` wrote (`$PDKIT_STEPS/NAME.sh`) runs instead, when there is one."""
    function = _function_name(name)
    lines = [f"{function}() {{"]
    if replaceable:
        script = f'"$PDKIT_STEPS/{name}.sh"'
        lines.append(f"  [ -e {script} ] && exec bash {script}")
    lines.append('  case "$SLURMD_NODENAME" in')
    for node, body in zip(nodes, ranks, strict=True):
        lines.append(f'    "${{{node_var(node)}}}")')
        lines.append(f"      {body} ;;")
    lines += ["  esac", "}", f"export -f {function}"]
    node_list = ",".join(f"${{{node_var(n)}}}" for n in nodes)
    lines.append(f'pdkit_keep {shlex.quote(name)} {len(nodes)} "{node_list}" {function} &')
    return lines


def _rank_body(log_path: str, line: str) -> str:
    log = shlex.quote(log_path)
    folder = shlex.quote(str(PurePosixPath(log_path).parent))
    return f"mkdir -p {folder} && {line} >>{log} 2>&1"


def _with_identity(plan: Plan, process: str, env: dict[str, str]) -> dict[str, str]:
    """The process's env with the deployment and process names, as supervisord and systemd
    give them on a host: the host checks tell this deployment's listeners from others'."""
    return {**env, "PDKIT_DEPLOYMENT": plan.name, "PDKIT_PROCESS": process}


def instance_steps(plan: Plan) -> dict[str, list[tuple[int, str]]]:
    """Each worker instance's step: (node index, what that node rank runs) per rank. Pure."""
    host_index = {host.name: i for i, host in enumerate(plan.hosts)}
    instances: dict[str, list[tuple[int, str]]] = {}
    for worker in sorted(plan.workers, key=lambda w: (w.instance_name, w.node_rank)):
        env = _with_identity(plan, worker.name, worker.env)
        body = _rank_body(
            worker.log_path, launch_line(worker.command, env, worker.python or "python")
        )
        instances.setdefault(worker.instance_name, []).append((host_index[worker.host], body))
    return instances


def router_step(plan: Plan) -> list[tuple[int, str]]:
    """The router's step, as `instance_steps` gives an instance's: its node and launch. Pure."""
    router = plan.router
    index = [h.name for h in plan.hosts].index(router.host)
    env = _with_identity(plan, router.name, router.env)
    return [(index, _rank_body(router.log_path, launch_line(router.command, env)))]


def added_step(ranks: list[tuple[int, str]], nodes: list[str]) -> str:
    """An instance added to the running job (`NAME.sh`): the rank body of the node the task
    runs on, `nodes` the allocation's node names in the topology's order."""
    lines = ['case "$SLURMD_NODENAME" in']
    for index, body in ranks:
        lines += [f"  {shlex.quote(nodes[index])})", f"    {body} ;;"]
    return "\n".join([*lines, "esac", ""])


def batch_script(plan: Plan) -> str:
    """The deployment as a Slurm batch script (`pdkit render --launcher slurm`)."""
    slurm = plan.slurm
    if slurm is None:
        raise ValueError("batch_script needs a Plan with launcher: slurm")
    out = [
        "#!/bin/bash",
        f"# pdkit deployment '{plan.name}' as one Slurm job: engine {plan.engine}, SGLang "
        f"{plan.sglang_version}, model {plan.model.path}, {len(plan.workers)} worker "
        f"process(es) and the {plan.router.kind} router on {slurm.nodes} node(s).",
        "# Submit: sbatch THIS_FILE; stop: scancel JOBID. `pdkit up` submits the same script.",
        *(f"#SBATCH {option}" for option in sbatch_options(plan, slurm)),
        "set -uo pipefail",
    ]
    if slurm.venv:
        out.append(f"export PATH={shlex.quote(slurm.venv + '/bin')}:$PATH")
    container = ""
    if slurm.container_image:
        container = f" --container-image={shlex.quote(slurm.container_image)}"
    out += [
        "",
        "# 1. The nodes Slurm gave, in the topology's order (node0 is the first).",
        'mapfile -t PDKIT_NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
    ]
    for i, host in enumerate(plan.hosts):
        out.append(f'export {node_var(i)}="${{PDKIT_NODES[{i}]}}"  # {host.name}')
    out += [
        "",
        "# 2. Each node's address, as the node sees it (its first one), for every launch line.",
        "pdkit_address() {",
        "  srun --overlap --nodes=1 --ntasks=1 --nodelist=\"$1\" hostname -I | awk '{print $1}'",
        "}",
    ]
    for i in range(len(plan.hosts)):
        out.append(f'export {address_var(i)}="$(pdkit_address "${{{node_var(i)}}}")"')
    out += ["", *_preflight(plan, slurm, container)]
    nodes_path = shlex.quote(nodes_file(slurm, "JOBID")).replace("JOBID", '"$SLURM_JOB_ID"')
    steps_path = shlex.quote(steps_dir(slurm, "JOBID")).replace("JOBID", '"$SLURM_JOB_ID"')
    pairs = " ".join(f'"${{{node_var(i)}}} ${{{address_var(i)}}}"' for i in range(len(plan.hosts)))
    go_path = shlex.quote(go_file(slurm, "JOBID")).replace("JOBID", '"$SLURM_JOB_ID"')
    out += [
        f"mkdir -p {shlex.quote(slurm.root)}",
        f"printf '%s\\n' {pairs} > {nodes_path}",
        "",
        f"# 2c. Under `pdkit up` ({HOLD_ENV} set): it runs the host checks of `pdkit provision "
        "--check`",
        "#     as steps on every node now, and writes the go file when they pass (else it "
        "cancels the job).",
        f'if [ -n "${{{HOLD_ENV}:-}}" ]; then',
        f"  for (( i = 0; i < {HOLD_ENV} * 5; i++ )); do",
        f"    [ -e {go_path} ] && break; sleep 0.2",
        "  done",
        f'  [ -e {go_path} ] || {{ echo "pdkit: no go from pdkit up within ${HOLD_ENV} s; '
        'nothing was started"; exit 1; }',
        "fi",
        "",
        "# 3. One step per instance (a task per node rank), started again when it ends.",
        f"export PDKIT_STEPS={steps_path}  # what `pdkit up` changes while the job runs",
        'mkdir -p "$PDKIT_STEPS"',
        "pdkit_keep() {  # NAME NODES NODELIST FUNCTION, until pdkit removes NAME",
        '  while [ ! -e "$PDKIT_STEPS/$1.removed" ]; do',
        f'    srun --overlap{container} --job-name="$1" --nodes="$2" --ntasks="$2" '
        '--ntasks-per-node=1 --nodelist="$3" bash -c "$4"',
        "    local status=$?",
        '    [ -e "$PDKIT_STEPS/$1.removed" ] && break',
        '    echo "pdkit: step $1 ended (status $status); starting it again in '
        f'{RESTART_DELAY_S} s"',
        f"    sleep {RESTART_DELAY_S}",
        "  done",
        "}",
    ]
    for name, ranks in instance_steps(plan).items():
        out += ["", *_step(name, [n for n, _ in ranks], [b for _, b in ranks])]
    ((router_node, router_body),) = router_step(plan)
    out += ["", *_step(plan.router.name, [router_node], [router_body], replaceable=True)]
    out += [
        "",
        "# 4. Serve until scancel or the time limit. An instance `pdkit up` adds live (a changed",
        "#    count) arrives as NAME.sh (its node ranks) and NAME.nodes (COUNT NODELIST), then",
        "#    NAME.add; it runs as a step kept like the others until pdkit removes it.",
        "pdkit_added() {  # NAME",
        "  local count nodelist",
        '  read -r count nodelist <"$PDKIT_STEPS/$1.nodes"',
        '  pdkit_keep "$1" "$count" "$nodelist" "bash $PDKIT_STEPS/$1.sh"',
        "}",
        "while true; do",
        '  for pdkit_add in "$PDKIT_STEPS"/*.add; do',
        '    [ -e "$pdkit_add" ] || continue',
        '    rm -f "$pdkit_add"',
        '    pdkit_added "$(basename "$pdkit_add" .add)" &',
        "  done",
        "  sleep 1",
        "done",
        "",
    ]
    return "\n".join(out)
