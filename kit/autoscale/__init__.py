"""`pdkit autoscale`: keep the prefill:decode split of a fixed pool of instances right as the
workload moves.

Modules, in the order one interval runs:

* ``observe``: the interval's workload and latencies, from the deltas of the router's and the
  workers' metrics
* ``forecast``: the next interval's workload (a documented moving average)
* ``model``: kit/perf corrected by what was observed (the fit of `pdkit size --calibrate`),
  and the predicted goodput of each split (kit/sizing's capacities)
* ``decide``: the decision engine, pure: inputs in, a decision and its reason out
* ``apply``: a move through SGLang's runtime role switch where the instances allow it, else
  through the live-change path of `pdkit up` (drain, stop, start)
* ``record``: the last decision, kept in the deployment's state folder for `pdkit status`
  and rendered as Prometheus text for the autoscaler's /metrics
* ``loop``: the foreground loop of `pdkit autoscale`

Sits above `kit.deploy` (it drives live changes) and `kit.sizing` (it asks its model).
"""
