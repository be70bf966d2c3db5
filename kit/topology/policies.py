"""Router policy names and defaults, in one place: validation, rendering and pdkit's router
all read them from here."""

PDKIT_POLICIES = {
    "prefill": ("prefix_affinity", "cache_aware", "least_inflight", "round_robin", "random"),
    "decode": ("least_inflight", "round_robin", "random"),
}
"""Policies of pdkit's router per role; the first is the default."""

SMG_POLICIES = (
    "random",
    "round_robin",
    "cache_aware",
    "power_of_two",
    "prefix_hash",
    "consistent_hashing",
)
"""Policies smg 1.13.0 accepts for --prefill-policy / --decode-policy."""

DEFAULT_POLICIES = {
    "pdkit": {role: names[0] for role, names in PDKIT_POLICIES.items()},
    "smg": {"prefill": "cache_aware", "decode": "round_robin"},
}
"""Router kind -> role -> the policy used when the topology names none."""
