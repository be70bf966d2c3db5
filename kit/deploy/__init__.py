"""Deploy a Plan onto its hosts with Ansible and wait until it serves.

Imports run one way: rollout -> live -> steps -> (gate, wait, runner, view, ...) -> context.

context   topology file -> DeployContext (Plan, state dir, hosts with their layout)
layout    where files live: state dir on the control machine, root prefix on each host
inventory Plan -> Ansible inventory (pure); the router API key travels only in the environment
runner    ansible-runner driver; events: its event stream -> progress and failure reports
wait      readiness polling from the control machine; readiness: the pure verdicts
services  supervisord's own view of local hosts (XML-RPC over its unix socket)
gate      the KV transfer gate (`pdkit up`'s last stage) and `pdkit doctor`
steps     what up, restart and provision share: options, timeouts, the deployment lock, a
          playbook run and a readiness wait as shown, the failure report, the end of a rollout
live      the steps of `changes` applied to a running deployment; routing: the router's worker API
rollout   `pdkit up` / `pdkit restart` / `pdkit down`; logs: `pdkit logs`; view: rich presentation
state     what runs, recorded per deployment; changes: record -> topology as steps (pure)
provision `pdkit provision`; wheels: the wheelhouse it can push; transfer_check (kvprobe.py on
          the hosts): `pdkit provision --transfer-test`
discover  `pdkit discover`; trace: `pdkit trace`
"""

from kit.deploy.context import DeployContext, load_context
from kit.deploy.rollout import down, restart, up
from kit.deploy.steps import UpOptions

__all__ = ["DeployContext", "UpOptions", "down", "load_context", "restart", "up"]
