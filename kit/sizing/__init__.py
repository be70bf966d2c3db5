"""`pdkit size`: how many prefill and decode instances, with what parallelism, serve a workload
within its SLO on given hosts, and the topology that deploys the answer.

Modules, in the order a sizing runs:

* ``problem``: the question (model, GPU, hosts as a base topology, SLO, workload, target rate)
* ``candidates``: role options (TP, DP attention and EP for MoE, searched knobs) and deployments
* ``measure``: goodput of one cluster in `kit.perf`'s virtual time, by bisection
* ``capacity``: stage one, every role option's single-instance goodput
* ``accept``: the validator's verdict on a candidate (placement, SGLang 0.5.23's rules)
* ``search``: estimates, verification and the ranking
* ``robustness``: the chosen deployment with longer and shorter requests
* ``emit``: the answer as a topology (hosts and NIC maps kept), with comments
* ``calibration``: fit the timing model's efficiency factors to a `pdkit bench` run, and keep them
* ``report``, ``plot``: the tables, the JSON and the Pareto chart
* ``command``: `pdkit size`'s options to all of the above

Depends on `kit.perf` (the model), `kit.sglang` and `kit.topology` (the checks), and reads a
bench run through `kit.bench.records` and the Plan's instances through `kit.bench.predict`.
"""
