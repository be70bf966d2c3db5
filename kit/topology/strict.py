"""The base of every topology model: frozen, and an unknown key is refused (with a suggestion,
by `kit.topology.load`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
