"""Deploy a Plan onto its hosts with Ansible and wait until it serves.

context   topology file -> DeployContext (Plan, state dir, hosts with their layout)
layout    where files live: state dir on the control machine, root prefix on each host
inventory Plan -> Ansible inventory (pure); the router API key travels only in the environment
runner    ansible-runner driver; events: its event stream -> progress and failure reports
wait      readiness polling from the control machine; readiness: the pure verdicts
services  supervisord's own view of local hosts (XML-RPC over its unix socket)
gate      the KV transfer gate (`pdkit up`'s last stage) and `pdkit doctor`
discover  `pdkit discover`; transfer_test (kvprobe on the hosts): `provision --transfer-test`
rollout   `pdkit up` / `pdkit down` / `pdkit restart`; logs: `pdkit logs`; view: rich presentation
state     what runs, recorded per deployment; changes: record -> topology as steps (pure)
live      the steps applied to a running deployment; routing: the router's worker API
"""

from kit.deploy.context import DeployContext, load_context
from kit.deploy.rollout import UpOptions, down, restart, up

__all__ = ["DeployContext", "UpOptions", "down", "load_context", "restart", "up"]
