"""Writing discovered fields into a topology file keeps the user's comments and layout."""

from __future__ import annotations

import pytest
import yaml

from kit.topology.edit import EditError, edit_topology

TEXT = """\
# Two H100 hosts; NICs to be discovered.
name: lab   # the deployment
engine: sglang
model:
  path: meta-llama/Llama-3.1-8B-Instruct
hosts:
  - name: gpu-a          # rack 1
    address: 10.0.0.1
    gpus: 4              # a guess
    rdma_devices:
      - mlx5_9           # wrong
  - {name: gpu-b, address: 10.0.0.2, gpus: 8}
prefill:
  hosts: [gpu-a]
# the decode side
decode:
  hosts: [gpu-b]
"""

NICS = {0: "mlx5_0", 1: "mlx5_0", 2: "mlx5_1"}


def test_fields_are_replaced_or_added_and_every_comment_stays():
    out = edit_topology(
        TEXT,
        {
            "gpu-a": {"gpus": 8, "gpu_type": "H100-SXM", "rdma_devices": ["mlx5_0", "mlx5_1"]},
            "gpu-b": {"gpus": 8, "gpu_nics": NICS},
        },
        {"gid_index": 3},
    )
    data = yaml.safe_load(out)
    a, b = data["hosts"]
    assert (a["gpus"], a["gpu_type"], a["rdma_devices"]) == (8, "H100-SXM", ["mlx5_0", "mlx5_1"])
    assert b["gpu_nics"] == NICS and b["address"] == "10.0.0.2"
    assert data["transfer"] == {"gid_index": 3}
    for comment in ("# Two H100 hosts", "# the deployment", "# rack 1", "# the decode side"):
        assert comment in out
    assert "gpus: 8              # a guess" in out  # the value changed, its comment stayed
    assert "    gpu_type: H100-SXM\n" in out  # a new key at the host's indentation
    assert "{name: gpu-b, address: 10.0.0.2, gpus: 8, gpu_nics: {0: mlx5_0" in out
    assert out.startswith(TEXT.splitlines()[0])


def test_an_existing_transfer_section_gets_the_key():
    text = TEXT + "transfer:\n  backend: mooncake  # RDMA\n"
    out = edit_topology(text, {}, {"gid_index": 5})
    assert "  backend: mooncake  # RDMA\n  gid_index: 5" in out
    assert yaml.safe_load(out)["transfer"] == {"backend": "mooncake", "gid_index": 5}
    again = edit_topology(out, {}, {"gid_index": 3})
    assert "gid_index: 3" in again and "gid_index: 5" not in again


def test_an_unknown_host_is_an_error():
    with pytest.raises(EditError, match="host 'gpu-z' is not in the topology"):
        edit_topology(TEXT, {"gpu-z": {"gpus": 1}})
