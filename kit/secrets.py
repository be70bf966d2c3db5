"""Secrets (API keys) from a file or an environment variable: one reader, one set of messages.

A key never comes from a command line or the topology itself: the topology names a variable
(`router.api_key_env`) or a file (`router.api_key_file`), and the load balancer takes
`--api-key-file` or its own variable. Every reader of such a key calls `read_secret`, so a
missing, unreadable or empty key is reported the same way everywhere:

    read_secret(SecretSource("router.api_key_file", file="/etc/pdkit/key"))
    -> SecretError: router.api_key_file /etc/pdkit/key cannot be read (No such file or
       directory). To fix: create the file with the key, or correct the path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kit.errors import PdkitError


class SecretError(PdkitError):
    """A key that was asked for is missing, unreadable or empty."""


@dataclass(frozen=True)
class SecretSource:
    """Where a key comes from. `setting` names the option or topology key that points there
    (it starts every message); `file` wins over `env` when both are given; with `required`, a
    variable that is unset is an error instead of "no key"."""

    setting: str
    file: str | Path | None = None
    env: str | None = None
    required: bool = True


def read_secret(source: SecretSource, environ: Mapping[str, str] | None = None) -> str | None:
    """The key, stripped of surrounding whitespace; None when the source names nothing (or an
    unset variable that is not required). Raises `SecretError` otherwise."""
    if source.file is not None and str(source.file):
        path = Path(source.file).expanduser()
        try:
            value = path.read_text().strip()
        except OSError as exc:
            raise SecretError(
                f"{source.setting} {path} cannot be read ({exc.strerror}). "
                "To fix: create the file with the key, or correct the path."
            ) from exc
        if not value:
            raise SecretError(f"{source.setting} {path} is empty. To fix: write the key into it.")
        return value
    if source.env:
        value = (os.environ if environ is None else environ).get(source.env, "").strip()
        if value:
            return value
        if source.required:
            raise SecretError(
                f"{source.setting} names {source.env}, which is not set (or empty) in this "
                f"shell. To fix: export {source.env}=<key> first."
            )
    return None
