"""What differs between SGLang versions, as one record a version module fills in.

    d = dialect("0.5.23")          # kit.sglang.dialects
    d.catalog                      # its flags (catalogs/0.5.23.json, from its own parser)
    d.startup_rules                # the values it refuses at start (kit/sglang/startup/v0_5_23.py)
    d.parallel_flags(dp=8, dp_attention=True)   # [("--attn-dp-size", "8")]
    d.flag("tp")                   # "--tp-size": every flag pdkit renders is spelled here
    d.packages.torch               # what provisioning installs for it

The renderer asks the dialect for every spelling that has changed between versions; a new
version is a new module here (see docs/development.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kit.sglang.catalog import Catalog, load_catalog
from kit.sglang.startup.rules import StartupRule
from kit.topology.args import Flag
from kit.topology.plan_types import Packages

__all__ = ["SPELLINGS", "Dialect", "Packages"]


SPELLINGS: dict[str, str] = {
    "model_path": "--model-path",
    "served_model_name": "--served-model-name",
    "revision": "--revision",
    "trust_remote_code": "--trust-remote-code",
    "host": "--host",
    "port": "--port",
    "mode": "--disaggregation-mode",
    "bootstrap_port": "--disaggregation-bootstrap-port",
    "transfer_backend": "--disaggregation-transfer-backend",
    "ib_device": "--disaggregation-ib-device",
    "tp": "--tp-size",
    "attention_dp": "--attn-dp-size",  # `--dp-size N --enable-dp-attention` is deprecated
    "replicas": "--dp-size",
    "ep": "--ep-size",
    "pp": "--pp-size",
    "dist_init_addr": "--dist-init-addr",
    "nnodes": "--nnodes",
    "node_rank": "--node-rank",
    "base_gpu_id": "--base-gpu-id",
    "device": "--device",
    "nccl_port": "--nccl-port",
    "kv_events_config": "--kv-events-config",
    "metrics": "--enable-metrics",
    "watchdog": "--watchdog-timeout",
    "dist_timeout": "--dist-timeout",
    "cuda_graph_decode": "--cuda-graph-backend-decode",  # `--disable-cuda-graph` is deprecated
    "cuda_graph_prefill": "--cuda-graph-backend-prefill",
}
"""Every flag pdkit renders, by pdkit's name for it -> its spelling in the versions that have
not renamed it (0.5.22 and 0.5.23 spell all of these alike: their catalogs differ only in
flags pdkit does not render). A test holds each dialect's spellings to its own catalog: there,
and not deprecated."""


@dataclass(frozen=True)
class Dialect:
    """One SGLang version: its catalog, start-up rules, flag spellings and environment names,
    and the packages it needs on a host."""

    version: str
    startup_rules: tuple[StartupRule, ...]
    packages: Packages
    spellings: Mapping[str, str] = field(default_factory=lambda: dict(SPELLINGS))
    """pdkit's name of each flag it renders -> this version's spelling (`SPELLINGS`, with a
    version module's changes: `{**SPELLINGS, "tp": "--tensor-parallel-size"}`)."""
    zmq_peer_allow_list: bool = True
    """It reads SGLANG_ZMQ_ALLOWED_PEERS and SGLANG_ZMQ_SOURCE_IP (0.5.23: CVE-2026-93034's
    fix, `srt/utils/network.py` restrict_zmq_peers)."""
    env: dict[str, str] = field(default_factory=dict)
    """pdkit's name for an environment variable -> this version's name for it."""
    notes: tuple[str, ...] = ()
    """Defaults that changed from the version before, which a deployment may notice
    (`pdkit validate --upgrade-to`)."""

    @property
    def catalog(self) -> Catalog:
        return load_catalog(self.version)

    def flag(self, name: str) -> str:
        """This version's spelling of the flag pdkit calls `name` (a key of `SPELLINGS`)."""
        return self.spellings[name]

    def arg(self, name: str) -> str:
        """The same as an `args:` key (no dashes), for flags merged under the user's args."""
        return self.flag(name).removeprefix("--")

    def parallel_flags(self, *, dp: int, dp_attention: bool) -> list[Flag]:
        """The data-parallel flags of an instance of `dp` ranks."""
        if dp_attention:
            return [(self.flag("attention_dp"), str(dp))]
        return [(self.flag("replicas"), str(dp))] if dp > 1 else []

    def env_name(self, name: str) -> str:
        return self.env.get(name, name)
