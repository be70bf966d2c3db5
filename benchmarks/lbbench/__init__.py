"""The pieces of `make bench-lb` (`python -m benchmarks.bench_lb`, which documents what it
measures).

Modules, bottom up:

* ``cpu``: CPU time of a process tree from /proc, and CPU pinning;
* ``load``: the load generator (raw asyncio HTTP/1.1 client): closed loop (throughput) and open
  loop (Poisson arrivals, latency);
* ``targets``: the routers under test (and the direct path), their command lines and processes;
* ``measure``: one measuring round per target and mode, summed over rounds;
* ``report``: the table, the ratios between routers, and the fake workers' headroom.

The fake PD workers are `tests.support.fake_worker`, shared with the load balancer's tests.
"""
