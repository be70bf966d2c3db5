"""Topology -> Plan: the one floor where a deployment is resolved.

    from kit.plan.resolve import resolve
    plan = resolve("topologies/local.yaml")   # raises TopologyError with every problem

`resolve` loads the topology (`kit.topology`), places it and chooses its RDMA devices once
(`kit.topology.place.placement`), runs every check on that placement (`kit.topology.validate`,
SGLang's in `kit.sglang.check`, the router's on the values it would be given in `router`), and
assembles the Plan (`build`): each worker's argv and env from `kit.sglang.render`, its launch
record (`launch`), the command of pdkit's router or smg's from the one table of router options
(`router`, `kit.topology.router_options`), Prometheus (`monitoring`). The modules are imported
on their own: loading SGLang's catalog is not free; the router's runtime (`kit.lb`) is not
imported at all.

The Plan's types are `kit.topology.plan_types` (and the launch records `kit.topology.launch`):
below this package, so that the layers it asks for argv can read them too.
"""
