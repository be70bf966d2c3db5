"""Benchmarks (`make bench-*`, `python -m benchmarks.bench_NAME`): they import kit and
tests.support and print ratios against a baseline run in the same process tree; no test imports
them."""
