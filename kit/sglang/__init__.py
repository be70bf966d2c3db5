"""SGLang as pdkit renders and checks it, for the pinned version (0.5.23): a worker's argv and
environment for ``python -m sglang.launch_server``, and every check SGLang would make of them.

Modules, bottom up:

* ``catalog`` (SGLang's launch flags: types, choices, defaults; read from ``catalogs/<version>
  .json``, generated from SGLang's own parser by ``make catalog``)
* ``cpu`` (the flags and environment real SGLang needs on a CPU host), ``hicache`` (topology
  `kv_pool:` -> HiCache's flags and the MOONCAKE_* environment)
* ``render`` (a worker's argv and env; pure and byte-identical for a topology)
* ``startup`` (values the parser accepts but SGLang refuses at start-up: ``startup/rules.py``
  says what a rule is, ``startup/v0_5_23.py`` is the pinned version's table)
* ``check`` (the user's flags against the catalog, the flags pdkit owns, what prefill and
  decode must agree on, the start-up rules; each problem points at its key)

`kit.plan` asks ``render`` for each worker's command; the sim (`kit.sim`) runs the same argv.
"""
