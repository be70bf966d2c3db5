"""SGLang launch flags, read from a catalog generated from SGLang's own parser.

Each supported SGLang version has a `catalogs/<version>.json`, written by
`tools/gen_catalog.py` (`make catalog`) from `ServerArgs.add_cli_args`. This module only
reads those files: it never imports SGLang, so the validator runs on a control machine
without it.

    catalog = load_catalog("0.5.23")
    spec = catalog.lookup("chunked_prefill_size")      # FlagSpec for --chunked-prefill-size
    catalog.check_value(spec, "abc")                   # "expects an integer, got 'abc'"
    catalog.suggest("chunk-prefill-size")              # "--chunked-prefill-size"
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, Literal

from kit.errors import RenderError

FlagKind = Literal["bool", "value", "list"]
_KINDS: tuple[FlagKind, ...] = ("bool", "value", "list")

# Value types SGLang's parser converts with a custom function, by that function's name.
_JSON_TYPES = frozenset({"json", "json_list_type", "parse_cuda_graph_config_arg"})
_STR_TYPES = frozenset({"str", "nullable_str", "parse_cuda_graph_backend_arg"})
# sglang.srt.utils.common.human_readable_int: a plain integer or an SI/IEC suffixed number.
# "Deprecated. Use --x instead.", "(Deprecated: use --x) ...", "(Deprecated, use --x) ...".
_REPLACEMENT = re.compile(r"\b[Uu]se (--\S.*?)(?: instead\b|\)|$)")
_HUMAN_INT = re.compile(r"\d+|\d+(\.\d+)?[kMGT]|\d+(Ki|Mi|Gi|Ti)")


@dataclass(frozen=True)
class FlagSpec:
    """One `launch_server` option as SGLang's parser defines it.

    `kind` is "bool" for options that take no value (store_true and friends), "list" for
    options taking one or more values (`nargs` "+"/"*"), else "value". `type` names the
    parser's converter ("int", "float", "str", "json", or a custom function's name such as
    "human_readable_int"). `choices` are compared as strings.
    """

    flag: str
    aliases: tuple[str, ...]
    dest: str
    kind: FlagKind
    type: str
    choices: tuple[str, ...] | None
    default: object
    nargs: int | str | None = None
    action: str = "store"
    deprecated: bool = False
    required: bool = False
    help: str = ""

    @property
    def option_strings(self) -> tuple[str, ...]:
        return (self.flag, *self.aliases)

    @property
    def replacement(self) -> str | None:
        """What SGLang's help text says to use instead of a deprecated flag
        ("--cuda-graph-backend-{decode,prefill}=disabled"), None when it names nothing."""
        if not self.deprecated:
            return None
        match = _REPLACEMENT.search(self.help)
        return match.group(1).strip().rstrip(".") if match else None


def _normalize(name: str) -> str:
    """`--foo_bar`, `foo-bar` and `foo_bar` all become `foo-bar`."""
    return name.strip().lstrip("-").replace("_", "-")


def _show(value: object) -> str:
    """A value the way the user wrote it in YAML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, dict):
        return "a mapping"
    return str(value)


class Catalog:
    """Every `launch_server` option of one SGLang version."""

    def __init__(self, version: str, specs: list[FlagSpec]) -> None:
        self.version = version
        self._specs: dict[str, FlagSpec] = {spec.flag: spec for spec in specs}
        self._by_name: dict[str, FlagSpec] = {}
        for spec in specs:
            for option in spec.option_strings:
                self._by_name[_normalize(option)] = spec

    def __len__(self) -> int:
        return len(self._specs)

    def __iter__(self) -> Iterator[FlagSpec]:
        return iter(self._specs.values())

    @property
    def flags(self) -> Mapping[str, FlagSpec]:
        """Canonical flag (e.g. "--tp-size") -> spec."""
        return self._specs

    def lookup(self, name: str) -> FlagSpec | None:
        """The option named exactly `name` (any of its option strings), else None.

        Leading dashes are optional and `_` stands for `-`: "tp_size", "tp-size", "--tp-size"
        and the alias "--tensor-parallel-size" all find `--tp-size`. Unlike argparse, a prefix
        ("--tp") does not match: pdkit writes full flag names.
        """
        return self._by_name.get(_normalize(name))

    def suggest(self, name: str) -> str | None:
        """The canonical flag closest to `name` (difflib), e.g. "chunk-prefill-size" ->
        "--chunked-prefill-size"; None when nothing is close."""
        key = _normalize(name)
        exact = self._by_name.get(key)
        if exact is not None:
            return exact.flag
        matches = difflib.get_close_matches(key, list(self._by_name), n=1)
        if matches:
            return self._by_name[matches[0]].flag
        # An abbreviation argparse would have expanded ("tp" -> "tp-size"): the shortest.
        longer = sorted((n for n in self._by_name if key and n.startswith(key)), key=len)
        return self._by_name[longer[0]].flag if longer else None

    def check_value(self, spec: FlagSpec, value: object) -> str | None:
        """None if SGLang's parser would accept `value` for `spec`, else why not.

        `value` comes from YAML (bool, int, float, str, list; None means "leave the flag out"
        and is accepted). A "bool" option needs true/false. A "list" option takes a list or
        one scalar (a one-item list). JSON-typed options take a string holding JSON.
        """
        if value is None:
            return None
        if spec.kind == "bool":
            if isinstance(value, bool):
                return None
            return f"is a switch: expects true or false, got {_show(value)}"
        if spec.kind == "list":
            items = value if isinstance(value, list) else [value]
            if not items and spec.nargs == "+":
                return "expects at least one value, got an empty list"
            for index, item in enumerate(items):
                problem = self._check_scalar(spec, item)
                if problem is not None:
                    return f"item {index + 1}: {problem}" if isinstance(value, list) else problem
            return None
        if isinstance(value, list):
            return f"expects a single value, got a list of {len(value)}"
        return self._check_scalar(spec, value)

    def _check_scalar(self, spec: FlagSpec, value: object) -> str | None:
        if isinstance(value, list | dict):
            kind = "mapping" if isinstance(value, dict) else "list"
            hint = "; quote it as a JSON string" if spec.type in _JSON_TYPES else ""
            return f"expects a single value, got a {kind}{hint}"
        if isinstance(value, bool):
            # A YAML true/false for a valued option renders as "True": never what was meant.
            return f"expects {_expected(spec.type)}, got {_show(value)}"
        as_text = _type_error_or_text(spec.type, value)
        if as_text[0] is not None:
            return as_text[0]
        text = as_text[1]
        if spec.choices is not None and text not in spec.choices:
            return f"must be one of {', '.join(spec.choices)}; got {_show(value)}"
        return None


def _expected(type_name: str) -> str:
    if type_name == "int":
        return "an integer"
    if type_name == "float":
        return "a number"
    if type_name == "human_readable_int":
        return "an integer (suffixes k, M, G, T, Ki, Mi, Gi, Ti allowed)"
    if type_name in _JSON_TYPES:
        return "a JSON string"
    return "a string"


def _type_error_or_text(type_name: str, value: object) -> tuple[str | None, str]:
    """(problem, canonical text of the value): the text is what choices are compared with."""
    bad = (f"expects {_expected(type_name)}, got {_show(value)}", "")
    if type_name == "int":
        if isinstance(value, int):
            return None, str(value)
        if isinstance(value, str):
            try:
                return None, str(int(value))
            except ValueError:
                return bad
        return bad
    if type_name == "float":
        if isinstance(value, int | float):
            return None, str(value)
        if isinstance(value, str):
            try:
                parsed = float(value)
            except ValueError:
                return bad
            return (None, value.strip()) if not math.isnan(parsed) else bad
        return bad
    if type_name == "human_readable_int":
        if isinstance(value, int) or (
            isinstance(value, str) and _HUMAN_INT.fullmatch(value.strip())
        ):
            return None, str(value).strip()
        return bad
    if type_name in _JSON_TYPES:
        if not isinstance(value, str):
            return bad
        try:
            parsed_json = json.loads(value)
        except json.JSONDecodeError as exc:
            return f"expects a JSON string, got {_show(value)} ({exc.msg})", ""
        if type_name == "parse_cuda_graph_config_arg" and not isinstance(parsed_json, dict):
            return f"expects a JSON object, got {_show(value)}", ""
        return None, value
    # "str" and converters pdkit does not know: anything scalar renders as text.
    if isinstance(value, str | int | float):
        return None, str(value)
    return bad


def _spec_from_json(flag: str, raw: Mapping[str, Any]) -> FlagSpec:
    options = [str(o) for o in raw["option_strings"]]
    kind = str(raw["kind"])
    if kind not in _KINDS:
        raise ValueError(f"{flag}: unknown kind {kind!r}")
    choices = raw.get("choices")
    nargs = raw.get("nargs")
    return FlagSpec(
        flag=flag,
        aliases=tuple(o for o in options if o != flag),
        dest=str(raw["dest"]),
        kind=kind,
        type=str(raw["type"]),
        choices=None if choices is None else tuple(str(c) for c in choices),
        default=raw.get("default"),
        nargs=nargs if isinstance(nargs, int | str) else None,
        action=str(raw.get("action", "store")),
        deprecated=bool(raw.get("deprecated", False)),
        required=bool(raw.get("required", False)),
        help=str(raw.get("help", "")),
    )


def _catalog_dir() -> Traversable:
    return resources.files("kit.sglang").joinpath("catalogs")


def _version_key(version: str) -> tuple[tuple[int, str], ...]:
    return tuple((int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"[.+-]", version))


def supported_versions() -> list[str]:
    """SGLang versions with a shipped flag catalog, oldest first."""
    names = [
        entry.name.removesuffix(".json")
        for entry in _catalog_dir().iterdir()
        if entry.name.endswith(".json")
    ]
    return sorted(names, key=_version_key)


class UnsupportedVersion(RenderError):
    """No flag catalog ships for the SGLang version asked for; `reason` and `fix` apart, so
    that validation can report them on the `sglang_version` key."""

    def __init__(self, version: str, supported: list[str]) -> None:
        self.reason = f"no flag catalog for SGLang {version}; supported: {', '.join(supported)}"
        self.fix = "set sglang_version to a supported version, or generate one with `make catalog`."
        super().__init__(f"{self.reason}. To fix: {self.fix}")


@functools.lru_cache(maxsize=8)
def load_catalog(version: str) -> Catalog:
    """The flag catalog of SGLang `version` (e.g. "0.5.23"); `UnsupportedVersion` if none
    ships, RenderError if it is unreadable."""
    supported = supported_versions()
    if version not in supported:
        raise UnsupportedVersion(version, supported)
    path = _catalog_dir().joinpath(f"{version}.json")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        specs = [_spec_from_json(flag, entry) for flag, entry in raw["options"].items()]
        recorded = str(raw["sglang_version"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RenderError(
            f"the flag catalog for SGLang {version} is unreadable ({exc}). "
            "To fix: regenerate it with `make catalog`."
        ) from exc
    if recorded != version:
        raise RenderError(
            f"the flag catalog file {version}.json was generated from SGLang {recorded}. "
            "To fix: regenerate it with `make catalog`."
        )
    return Catalog(version, specs)
