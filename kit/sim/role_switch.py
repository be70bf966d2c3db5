"""`POST /pd_role_switch`: SGLang 0.5.23's runtime role switch, with its refusals.

Read from SGLang's `srt/entrypoints/http_server.py` (the route: 200 on success, 400 otherwise,
the body `PdRoleSwitchReqOutput`: success, message, old_role, new_role, safe_to_restore),
`srt/managers/tokenizer_control_mixin.py` (the tokenizer's own flag check) and
`srt/disaggregation/role_switch.py` (`_reject_reason`'s table, then same role, then idle). In
that order:

    --enable-pd-role-switch not set     "--enable-pd-role-switch is not set on this server"
    new_role not prefill or decode      "invalid new_role='...'"
    not in PD mode                      "instance is not running in PD disaggregation mode"
    backend without the switch          "transfer backend 'fake' does not support runtime role
                                        switch" (mooncake declares it; the sim's fake decode
                                        backend, like SGLang's, does not)
    already in the role                 success, "already in target role"
    not idle                            "instance is not idle; drain all requests before
                                        switching" (safe to restore)
    to decode without decode_cuda_graph_memory_gb
                                        "decode_cuda_graph_memory_gb is required before
                                        capturing decode graphs" (no decode graphs captured:
                                        the sim captures none, as SGLang on a prefill; a
                                        router reads the footprint from a decode peer's
                                        /server_info internal_states); a negative one
                                        "... must be non-negative"
Then the role flips: the engine's schedulers are rebuilt for the new role (the KV pool and the
launch values kept), answer "ok". The GPU headroom behind the footprint is never short here.
"""

from __future__ import annotations

from typing import Any

from kit.sim.engine import Engine

SUPPORTS_SWITCH = ("mooncake", "mooncake_tcp")
"""Transfer backends whose KV manager declares `supports_role_switch` (the sim's
mooncake_tcp is Mooncake over TCP)."""


def answer(success: bool, message: str, old: str, new: str, safe: bool = False) -> dict[str, Any]:
    return {
        "success": success,
        "message": message,
        "old_role": old,
        "new_role": new,
        "safe_to_restore": safe,
    }


def switch(engine: Engine, body: Any) -> tuple[int, dict[str, Any]]:
    """Handle one request body against `engine`: (HTTP status, answer); flips the role on
    success."""
    new = str((body or {}).get("new_role") or "") if isinstance(body, dict) else ""
    new = new.lower()
    old = engine.mode.value
    args = engine.args
    if not args.enable_pd_role_switch:
        return 400, answer(
            False, "--enable-pd-role-switch is not set on this server", old, new, True
        )
    if new not in ("prefill", "decode"):
        return 400, answer(False, f"invalid new_role={new!r}", old, new, True)
    if old == "null":
        return 400, answer(
            False, "instance is not running in PD disaggregation mode", old, new, True
        )
    backend = args.disaggregation_transfer_backend
    if backend not in SUPPORTS_SWITCH:
        return 400, answer(
            False,
            f"transfer backend {backend!r} does not support runtime role switch",
            old,
            new,
            True,
        )
    if new == old:
        return 200, answer(True, "already in target role", old, new)
    if not engine.idle:
        return 400, answer(
            False, "instance is not idle; drain all requests before switching", old, new, True
        )
    if new == "decode":
        # No decode CUDA graphs were captured (the sim captures none, as SGLang on a prefill
        # or on the CPU): SGLang wants the footprint measured on a decode peer first.
        required = body.get("decode_cuda_graph_memory_gb")
        if required is None:
            return 400, answer(
                False,
                "decode_cuda_graph_memory_gb is required before capturing decode graphs",
                old,
                new,
                True,
            )
        if not isinstance(required, int | float) or required < 0:
            return 400, answer(
                False, "decode_cuda_graph_memory_gb must be non-negative", old, new, True
            )
    engine.switch_role(new)
    return 200, answer(True, "ok", old, new)
