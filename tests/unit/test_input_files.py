"""Files the workers' flags name (--init-expert-location, --deepep-config) are in the Plan and
in each worker's inventory record, so that `pdkit up` checks them on every host of the
instance."""

from __future__ import annotations

from kit.hosts.inventory import worker_record
from kit.plan.resolve import resolve
from kit.topology.layout import HostLayout
from tests.conftest import REPO

PREFILL_FILES = (
    ("--init-expert-location", "/data/eplb/prefill_in4096.json"),
    ("--deepep-config", "/data/deepep/prefill_config.json"),
)


def test_every_node_of_an_instance_lists_the_files_its_flags_name():
    plan = resolve(REPO / "topologies" / "deepseek-r1-ep.yaml")
    prefill = [w for w in plan.workers if w.role == "prefill"]
    assert len(prefill) == 4
    assert {w.input_files for w in prefill} == {PREFILL_FILES}
    assert {w.input_files for w in plan.workers if w.role == "decode"} == {()}
    record = worker_record(prefill[1], plan.name, HostLayout(plan.name, "/"))
    assert record["input_files"] == [list(pair) for pair in PREFILL_FILES]


def test_a_value_that_is_not_an_absolute_path_is_no_file(write_topology):
    from tests.conftest import base_topology  # noqa: PLC0415

    data = base_topology()
    data["prefill"]["args"] = {"init-expert-location": "trivial"}
    plan = resolve(write_topology(data))
    assert {w.input_files for w in plan.workers} == {()}
