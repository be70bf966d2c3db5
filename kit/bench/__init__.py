"""`pdkit bench`: the goodput of a live deployment (or any OpenAI-compatible server) under its
SLO. Workloads come from `kit.perf.workload` (the ones `pdkit size` plans for).

prompts   prompt text of a token count by the sim's rule; request bodies
client    one request sent and timed (first token, every gap, the PD path it took)
runner    one load point: open loop at a rate or closed loop at a concurrency
machine   was the client or this machine the bottleneck rather than the deployment
records   one request as the client saw it (requests.jsonl)
metrics   a point's numbers: attainment, goodput, percentiles, errors, suspects
search    the goodput rate by doubling, bisection and repeats at the boundary
predict   kit/perf's prediction for the Plan's instances
plots     the PNG figures; view: what is printed; compare: runs side by side
options   the CLI's options -> a target and BenchOptions; run: the command itself
"""
