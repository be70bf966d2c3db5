"""SGLang as the reference: its own parser and start-up hooks, the request corpus sent to it and to
the sim, and the start-up cases. `sglang_parser` runs in pdkit's venv and calls the SGLang-side
scripts (`sglang_parse`, `sglang_hooks`, `sglang_requests`, with `sglang_shim`) by path with
SGLang's interpreter (`.venv-sglang`); those import one another as top-level modules."""
