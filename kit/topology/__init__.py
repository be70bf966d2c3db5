"""The topology: one YAML file -> a checked, placed deployment; the floor every other package of
kit stands on. It imports nothing above it.

Modules, bottom up:

* ``ports`` (default ports), ``policies`` (router policy names), ``layout`` (process, unit and
  file names on a host), ``launch`` (parallelism and a worker's typed launch record),
  ``sim_env`` (engine sim's environment keys the Plan reads)
* ``strict`` (the models' base), ``cluster`` (`cluster:`, the wide-EP profile),
  ``autoscale_schema`` (`autoscale:`), ``schema`` (the pydantic models: shape only), ``load``
  (YAML with positions -> `Topology`, every shape error at once), ``edit`` (set fields of a
  topology's text, comments kept)
* ``args`` (`args:` values -> flags), ``nics`` (the RDMA devices each worker uses), ``place``
  (instances -> hosts, GPUs and ports), ``timeouts`` (SGLang's PD timeouts as environment)
* ``plan_types`` (the Plan's types, which `kit.plan` builds and every later stage reads)
* checks of meaning, each problem naming its key and the fix: ``listeners`` (every port a
  worker listens on), ``cpu_hosts``, ``kvpool`` (`kv_pool:`), ``autoscale_checks``
  (`autoscale:`), and ``validate``, which runs them all on one placement

SGLang's own checks of the flags are `kit.sglang`'s; `kit.plan` runs both and assembles the Plan.
"""
