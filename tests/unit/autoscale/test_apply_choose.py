"""Which instances a move takes: the ones whose drain ends soonest."""

from __future__ import annotations

from kit.autoscale.apply import choose

ROLES = {"prefill-1": "prefill", "decode-1": "decode", "decode-2": "decode", "decode-3": "decode"}
PLAN = dict(ROLES)


def test_the_decodes_with_the_fewest_requests_in_flight_move_first():
    inflight = {"decode-1": 3, "decode-2": 0, "decode-3": 7}
    assert choose(ROLES, PLAN, inflight, "decode", 2) == ["decode-2", "decode-1"]


def test_at_equal_load_an_instance_outside_its_plan_role_goes_back_first():
    # prefill-1 serves as a decode after an earlier move: switching it back restores the Plan.
    roles = {**ROLES, "prefill-1": "decode"}
    inflight = {"prefill-1": 2, "decode-1": 2, "decode-2": 2, "decode-3": 2}
    assert choose(roles, PLAN, inflight, "decode", 1) == ["prefill-1"]
    # Without counts (smg's /workers has none) the last names go.
    assert choose(ROLES, PLAN, {}, "decode", 2) == ["decode-3", "decode-2"]


def test_only_instances_serving_the_giving_role_are_chosen():
    assert choose(ROLES, PLAN, {}, "prefill", 3) == ["prefill-1"]
