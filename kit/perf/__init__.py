"""The performance model: how fast SGLang serves a model on given GPUs.

Modules, bottom up:

* ``hfcache`` (a model's ``config.json`` in the local Hugging Face cache)
* ``models`` (model shapes from a ``config.json``: parameters, active parameters, KV bytes
  per token; shipped configs in ``models/``), ``gpus`` (GPU specs)
* ``timing`` (the roofline step time, KV capacity, SGLang's memory defaults)
* ``clock`` (real and virtual time), ``kv_pages`` (a scheduler's KV pages, not the ``kv_pool:``
  feature), ``scheduler`` (SGLang's batching), ``counting`` (the same batching with decode
  tokens counted rather than emitted one by one: virtual-time runs)
* ``workload`` (synthetic requests: lengths and arrival times)
* ``cluster`` (instances in virtual time: colocated, prefill-only, decode-only, xPyD)
* ``sweep`` (latency percentiles, SLO attainment and goodput at request rates; the SLO is the
  topology's, in milliseconds)

The sim worker runs this model in real time; planning and benchmarks run it in virtual time.
Nothing here imports `kit.sim`.
"""
