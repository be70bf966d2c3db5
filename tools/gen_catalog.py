"""Write SGLang's launch-flag catalog from SGLang's own argument parser.

Run with the SGLang venv (see `make catalog`):

    .venv-sglang/bin/python tools/gen_catalog.py --out kit/sglang/catalogs/0.5.23.json
    .venv-sglang/bin/python tools/gen_catalog.py --check kit/sglang/catalogs/0.5.23.json

The catalog lists every option of `python -m sglang.launch_server` (built with
`ServerArgs.add_cli_args`) except `-h/--help`: its option strings, dest, kind (`bool` for
options that take no value, `list` for `nargs` `+`/`*`, else `value`), value type, choices,
default, nargs and the first sentence of its help. Output is deterministic: sorted keys,
indent 1, trailing newline, choices given as a set sorted, and `SGLANG_*` environment
variables removed before SGLang is imported (some of them change choices).

`pdkit` reads the result at run time through `kit.sglang.catalog` without importing SGLang.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

# Run as a script (`python tools/gen_catalog.py`) in the SGLang venv. The shim that lets SGLang's
# parser import there is shared with the parser oracles the tests run, so it lives with them.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "oracles"))

import sglang_shim

HELP_MAX_CHARS = 120
_ABBREVIATION = re.compile(r"\b(e\.g|i\.e|etc|vs|approx|resp)\.$", re.IGNORECASE)

_ACTION_NAMES = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_StoreConstAction": "store_const",
    "_AppendAction": "append",
    "_CountAction": "count",
    "BooleanOptionalAction": "boolean_optional",
}


def _type_name(action: argparse.Action, kind: str) -> str:
    if kind == "bool":
        return "bool"
    converter = action.type
    if converter is None:
        return "str"
    if converter in (int, float, str, bool):
        return converter.__name__
    name = getattr(converter, "__name__", type(converter).__name__)
    module = getattr(converter, "__module__", "") or ""
    if name == "loads" and module.split(".")[0] in {"json", "orjson"}:
        return "json"
    return str(name)


def _kind(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0:
        return "bool"
    if action.nargs in ("+", "*") or (isinstance(action.nargs, int) and action.nargs > 1):
        return "list"
    return "value"


def _choices(action: argparse.Action) -> list[str] | None:
    if action.choices is None:
        return None
    if isinstance(action.choices, set | frozenset):
        return sorted(str(c) for c in action.choices)
    return [str(c) for c in action.choices]


def _first_sentence(text: str | None) -> str:
    if not text or text == argparse.SUPPRESS:
        return ""
    text = " ".join(text.split()).replace("%%", "%")
    for match in re.finditer(r"[.!?](?= )", text):
        head = text[: match.end()]
        # "e.g. 32" is not a sentence end; "Deprecated." alone says too little to stop there.
        if _ABBREVIATION.search(head) or len(head) < 20:
            continue
        text = head
        break
    if len(text) > HELP_MAX_CHARS:
        text = text[: HELP_MAX_CHARS - 3].rstrip() + "..."
    return text


def _describe(action: argparse.Action) -> dict[str, Any]:
    kind = _kind(action)
    action_class = type(action).__name__
    help_text = _first_sentence(action.help)
    deprecated = action_class.startswith("Deprecated") or help_text.lower().lstrip("(").startswith(
        "deprecated"
    )
    default = None if action.default is argparse.SUPPRESS else action.default
    return {
        "option_strings": list(action.option_strings),
        "dest": action.dest,
        "kind": kind,
        "type": _type_name(action, kind),
        "choices": _choices(action),
        "default": sglang_shim.json_safe(default),
        "nargs": action.nargs,
        "action": _ACTION_NAMES.get(action_class, action_class),
        "deprecated": deprecated,
        "required": bool(action.required),
        "help": help_text,
    }


def build_catalog() -> dict[str, Any]:
    for name in [n for n in os.environ if n.startswith("SGLANG_")]:
        del os.environ[name]
    parser = sglang_shim.build_parser()
    options: dict[str, Any] = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        flag = action.option_strings[0]
        if flag in options:
            raise SystemExit(f"two parser actions claim {flag}")
        options[flag] = _describe(action)
    return {
        "format": 1,
        "generated_by": "tools/gen_catalog.py",
        "sglang_version": sglang_shim.sglang_version(),
        "option_count": len(options),
        "options": options,
    }


def render(catalog: dict[str, Any]) -> str:
    return json.dumps(catalog, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def diff_summary(old: dict[str, Any], new: dict[str, Any], limit: int = 40) -> list[str]:
    """Human-readable differences between two catalogs (old = file, new = generated)."""
    lines: list[str] = []
    for key in sorted(set(old) | set(new)):
        if key != "options" and old.get(key) != new.get(key):
            lines.append(f"{key}: file has {old.get(key)!r}, SGLang gives {new.get(key)!r}")
    old_opts: dict[str, Any] = old.get("options", {})
    new_opts: dict[str, Any] = new.get("options", {})
    for flag in sorted(set(new_opts) - set(old_opts)):
        lines.append(f"+ {flag} (missing from the file)")
    for flag in sorted(set(old_opts) - set(new_opts)):
        lines.append(f"- {flag} (not in SGLang's parser)")
    for flag in sorted(set(old_opts) & set(new_opts)):
        a, b = old_opts[flag], new_opts[flag]
        for field in sorted(set(a) | set(b)):
            if a.get(field) != b.get(field):
                lines.append(f"~ {flag}.{field}: file {a.get(field)!r} -> SGLang {b.get(field)!r}")
    if len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more"]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--out", type=Path, help="write the catalog to this file")
    target.add_argument(
        "--check", type=Path, help="compare with this file; exit 1 and summarise if different"
    )
    args = parser.parse_args(argv)

    catalog = build_catalog()
    text = render(catalog)
    if args.check is not None:
        try:
            existing = args.check.read_text(encoding="utf-8")
        except FileNotFoundError:
            print(f"{args.check}: no such file; generate it with --out", file=sys.stderr)
            return 1
        if existing == text:
            print(f"{args.check}: up to date ({catalog['option_count']} options)")
            return 0
        try:
            old = json.loads(existing)
        except json.JSONDecodeError as exc:
            print(f"{args.check}: not valid JSON ({exc}); regenerate it with --out")
            return 1
        summary = diff_summary(old, catalog) or ["formatting differs (same content)"]
        print(f"{args.check} differs from SGLang's parser; regenerate with `make catalog`:")
        print("\n".join(f"  {line}" for line in summary))
        return 1
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out} ({catalog['option_count']} options, {len(text)} bytes)")
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
