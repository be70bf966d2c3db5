"""Developer tools and benchmarks (not part of the installed package)."""
