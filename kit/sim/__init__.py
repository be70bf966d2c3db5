"""The ``sim`` engine: an emulated SGLang worker.

``python -m kit.sim ARGV`` takes the argv pdkit renders for ``python -m sglang.launch_server``,
answers SGLang's HTTP API (``/generate``, ``/v1/completions``, ``/v1/chat/completions``,
health, info, loads, metrics), follows SGLang's prefill/decode protocol (bootstrap server,
``bootstrap_room``, SGLang's timeouts), moves KV bytes for real over the Mooncake transfer
engine, and takes the time a real GPU would: it runs `kit.perf`'s scheduler and timing model
on a real-time clock.

Modules, bottom up:

* ``settings`` (``PDKIT_SIM_*`` and the SGLang variables honoured), ``args`` (the argv)
* ``tokens`` (the token rule, emulated outputs), ``requests`` (one request's state)
* ``transfer`` (Mooncake), ``bootstrap`` (prefill side), ``pd_client`` (decode side)
* ``caching`` (the prompt caches: the radix cache per rank, HiCache's tiers)
* ``engine`` (ranks and the PD hand-off), ``api_native``/``api_openai``/``metrics``/``server``
  (HTTP), ``worker`` (process lifecycle), ``__main__`` (entry point)

The performance model (model shapes, GPU specs, timing, KV pool, scheduler, virtual-time
sweeps) is `kit.perf`.
"""
