"""What acts on hosts rather than on a deployment's rollout: reaching them (SSH, Ansible runs),
provisioning and checking them, and the probes run on them. `kit.deploy` (the rollout engine)
imports this package; nothing here imports `kit.deploy`.

Imports run one way: provision/discover/hostcheck -> transfer_check/pool_check -> context ->
(inventory, logs, playbook, progress, state_dir).

context        topology file -> DeployContext (Plan, state dir, hosts with their layout); the
               per-deployment lock of up/down/provision
state_dir      where a deployment's state lives on the control machine; paths in messages
inventory      Plan -> Ansible inventory (pure); the router API key travels only in the environment
logs           a process's log on its host (locally or over SSH): `pdkit logs`; ssh_argv
playbook       ansible-runner driver: pdkit's playbooks folder (package data), one run, the
               failure report; the host scripts in the roles' files/
events         Ansible's event stream -> progress and failure reports; progress: the rich view
provision      `pdkit provision`; wheels: the wheelhouse it can push
hostcheck      `pdkit provision --check` (roles/pdkit_check/files/host_check.py on each host)
transfer_check `pdkit provision --transfer-test` (roles/pdkit_check/files/kvprobe.py, sent on
               stdin); pool_check: the KV pool probe (poolprobe.py, beside it)
discover       `pdkit discover`: each host's GPUs and NICs -> the topology's hosts
"""
