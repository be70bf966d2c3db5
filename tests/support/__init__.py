"""What the tests share: load-balancer and local clusters, deploy helpers, the multi-host test bed
(network namespaces), test doubles (the fake PD worker, sim worker processes), the Markdown reader
of the docs tests and the sizing questions. Benchmarks may import it; it imports kit and
tests.conftest, never a test module."""
