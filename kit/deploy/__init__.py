"""Deploy a Plan onto its hosts with Ansible and wait until it serves: the rollout engine.
What acts on the hosts themselves (the context, inventory, Ansible runs, logs, provisioning,
host checks, probes) is `kit.hosts`, below this package.

Imports run one way: rollout, upgrade -> live -> steps -> (gate, wait, view, ...) -> kit.hosts.

wait      readiness polling from the control machine; readiness: the pure verdicts
services  supervisord's own view of local hosts (XML-RPC over its unix socket)
gate      the KV transfer gate (`pdkit up`'s last stage) and `pdkit doctor`
steps     what up, restart and provision share: options, timeouts, a playbook run and a
          readiness wait as shown, the failure report, the end of a rollout
live      the steps of `changes` applied to a running deployment; routing: the router's worker API
rollout   `pdkit up` / `pdkit restart` / `pdkit down`; view: rich presentation of readiness
upgrade   `pdkit upgrade`: live's path to another topology's settings, each instance gated on
          its tokens, rolled back at the first failure, its progress kept for --resume
state     what runs, recorded per deployment; changes: record -> topology as steps (pure);
          surge: the stand-ins of a live change
trace     `pdkit trace`
"""

from kit.deploy.rollout import down, restart, up
from kit.deploy.steps import UpOptions
from kit.hosts.context import DeployContext, load_context

__all__ = ["DeployContext", "UpOptions", "down", "load_context", "restart", "up"]
