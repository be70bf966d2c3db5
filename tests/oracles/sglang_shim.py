"""Import SGLang's argument parser in a venv that has no GPU stack.

Shared by `tools/gen_catalog.py` and the oracles here (`sglang_parse.py`, `sglang_hooks.py`); run
with the SGLang venv's python (`.venv-sglang`, which holds `sglang` installed with `--no-deps`, a
CPU torch and the small pure dependencies listed in the Makefile).

Two things stand between that venv and `sglang.srt.server_args`:

- `sglang/__init__.py` imports the frontend language API and patches transformers, neither of
  which the parser needs (and transformers is not installed). We register a bare package
  object for `sglang` whose `__path__` points at the installed package, so submodules import
  normally while `__init__.py` never runs.
- `sglang/srt/utils/common.py` does `import triton` at module level. Unless a real triton is
  installed, a meta-path finder answers `triton` and `triton.*` with inert stub modules: any
  attribute is a stub, calling one with a single function returns that function (so
  `@triton.jit` leaves the function alone). No kernel is ever launched by the parser.

Nothing here touches a device or the network.
"""

from __future__ import annotations

import argparse
import enum
import importlib.abc
import importlib.machinery
import importlib.util
import json
import math
import os
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any


class _Stub:
    """Stands in for any triton object: attributes, calls, subscripts and base classes."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Stub:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Stub(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Decorator use (`@triton.jit`, `@triton.autotune(...)(fn)`): hand the function back.
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Stub(f"{self._name}()")

    def __getitem__(self, key: object) -> _Stub:
        return _Stub(f"{self._name}[]")

    def __iter__(self) -> Iterator[Any]:
        # Empty: without this, iterating falls back to __getitem__ and never ends.
        return iter(())

    def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type, ...]:
        return (object,)

    def __repr__(self) -> str:
        return f"<triton stub {self._name}>"


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str) -> _Stub:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Stub(f"{self.__name__}.{attr}")


class _TritonStubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "triton" or fullname.startswith("triton."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+pdkit-stub"  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


_prepared = False


def prepare_imports() -> None:
    """Make `import sglang.srt.server_args` work without triton and without `sglang/__init__`."""
    global _prepared  # noqa: PLW0603 - one-shot process setup
    if _prepared:
        return
    _prepared = True
    # Belt and braces: nothing the parser does should reach the Hugging Face Hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if importlib.util.find_spec("triton") is None:
        sys.meta_path.insert(0, _TritonStubFinder())
    if "sglang" not in sys.modules:
        spec = importlib.util.find_spec("sglang")
        if spec is None or spec.submodule_search_locations is None:
            raise SystemExit("sglang is not installed in this interpreter: " + sys.executable)
        package = types.ModuleType("sglang")
        package.__path__ = list(spec.submodule_search_locations)
        package.__file__ = spec.origin
        package.__spec__ = spec
        package.__package__ = "sglang"
        sys.modules["sglang"] = package


def sglang_version() -> str:
    prepare_imports()
    from sglang.version import __version__  # noqa: PLC0415

    return str(__version__)


def build_parser(prog: str = "sglang serve") -> argparse.ArgumentParser:
    """SGLang's own `launch_server` parser (what `prepare_server_args` builds)."""
    prepare_imports()
    from sglang.srt.server_args import ServerArgs  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog=prog)
    ServerArgs.add_cli_args(parser)
    return parser


def json_safe(value: Any) -> Any:
    """A JSON-serialisable rendering of an argparse default or a parsed value."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, enum.Enum):
        return json_safe(value.value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, set | frozenset):
        return sorted((json_safe(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    # Anything else (a callable, an object) has no meaningful JSON form.
    return None
