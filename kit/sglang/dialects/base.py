"""What differs between SGLang versions, as one record a version module fills in.

    d = dialect("0.5.23")          # kit.sglang.dialects
    d.catalog                      # its flags (catalogs/0.5.23.json, from its own parser)
    d.startup_rules                # the values it refuses at start (kit/sglang/startup/v0_5_23.py)
    d.parallel_flags(dp=8, dp_attention=True)   # [("--attn-dp-size", "8")]
    d.packages.torch               # what provisioning installs for it

The renderer asks the dialect for every spelling that has changed between versions; a new
version is a new module here (see docs/development.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kit.sglang.catalog import Catalog, load_catalog
from kit.sglang.startup.rules import StartupRule
from kit.topology.args import Flag
from kit.topology.plan_types import Packages

__all__ = ["Dialect", "Packages"]


@dataclass(frozen=True)
class Dialect:
    """One SGLang version: its catalog, start-up rules, flag spellings and environment names,
    and the packages it needs on a host."""

    version: str
    startup_rules: tuple[StartupRule, ...]
    packages: Packages
    attention_dp_flag: str = "--attn-dp-size"
    """Attention DP of width dp (the old `--dp-size N --enable-dp-attention` is deprecated)."""
    replicas_flag: str = "--dp-size"
    """Data-parallel replicas."""
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

    def parallel_flags(self, *, dp: int, dp_attention: bool) -> list[Flag]:
        """The data-parallel flags of an instance of `dp` ranks."""
        if dp_attention:
            return [(self.attention_dp_flag, str(dp))]
        return [(self.replicas_flag, str(dp))] if dp > 1 else []

    def env_name(self, name: str) -> str:
        return self.env.get(name, name)
