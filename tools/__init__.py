"""Generators: SGLang flag catalogs, the topology reference in docs/, wheelhouses (not part of
the installed package; nothing here is imported by kit, tests or benchmarks)."""
