"""Review a start-up rule table against another SGLang version's source.

Run with pdkit's venv, pointing at the new version's installed `sglang/srt`:

    .venv/bin/python -m tools.review_startup_rules --base 0.5.23 \
        --srt .venv-sglang-0.5.22/lib/python3.11/site-packages/sglang/srt

For each rule of the base version's table (kit/sglang/startup/v<base>.py) it looks for the
rule's message (every literal part of `says`) in the file its `source` names, in the new
source, and prints: the rules whose raise moved (new file:line, as the new table's `SOURCES`),
the rules whose message or hook function the new version lacks (the new table's `ABSENT`).
A person reads the output and the diff of the hooks before trusting it: a check whose message
stayed but whose condition changed is not found this way.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

from kit.sglang.startup.rules import StartupRule

WINDOW = 25
"""Lines between a message's text and the raise pdkit's table points at."""


def _fragments(says: str) -> list[str]:
    parts = [p.strip() for p in re.split(r"\{[^}]*\}", says)]
    return [p[:40] for p in parts if len(p) >= 8]


def _hits(lines: list[str], fragment: str) -> list[int]:
    return [i + 1 for i, line in enumerate(lines) if fragment[:30] in line]


def review(rule: StartupRule, base_srt: Path, new_srt: Path) -> tuple[str, str]:
    """("same" | "moved" | "absent", the new source or why absent)."""
    if not rule.source:
        return "same", ""
    file, _, line_text = rule.source.partition(":")
    old_file, new_file = base_srt / file, new_srt / file
    if not new_file.exists():
        return "absent", f"no {file}"
    old_lines = old_file.read_text().splitlines()
    new_lines = new_file.read_text().splitlines()
    if rule.hook:
        module, function = rule.hook.rsplit(".", 1)
        hook_file = new_srt / "arg_groups" / f"{module}.py"
        text = hook_file.read_text() if hook_file.exists() else ""
        if not re.search(rf"^def {function}\(", text, re.MULTILINE):
            return "absent", f"no function {function} in arg_groups/{module}.py"
    fragments = _fragments(rule.says)
    if not fragments:
        return "same", rule.source
    old_line = int(line_text)
    anchor = fragments[0]
    near = [h for h in _hits(old_lines, anchor) if abs(h - old_line) <= WINDOW]
    if not near:
        return "absent", f"the base source has no {anchor!r} near {rule.source}"
    old_hits = _hits(old_lines, anchor)
    matched = min(near, key=lambda h: abs(h - old_line))
    offset = old_line - matched
    candidates = _hits(new_lines, anchor)
    if len(candidates) == len(old_hits):  # the same occurrence, in order, first
        rank = old_hits.index(matched)
        candidates = [candidates[rank], *candidates[:rank], *candidates[rank + 1 :]]
    for hit in candidates:
        block = "\n".join(new_lines[max(0, hit - WINDOW) : hit + WINDOW])
        if all(f[:30] in block for f in fragments):
            source = f"{file}:{hit + offset}"
            return ("same" if source == rule.source else "moved"), source
    return "absent", f"message {anchor!r} not in {file}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the version whose table is reviewed")
    parser.add_argument("--base-srt", type=Path, default=None, help="its sglang/srt")
    parser.add_argument("--srt", type=Path, required=True, help="the new version's sglang/srt")
    args = parser.parse_args(argv)
    module = importlib.import_module(f"kit.sglang.startup.v{args.base.replace('.', '_')}")
    base_srt = args.base_srt or Path(".venv-sglang/lib/python3.11/site-packages/sglang/srt")
    moved: dict[str, str] = {}
    absent: dict[str, str] = {}
    for rule in module.RULES:
        verdict, where = review(rule, base_srt, args.srt)
        if verdict == "moved":
            moved[rule.name] = where
        elif verdict == "absent":
            absent[rule.name] = where
    print(f"# {len(module.RULES)} rules of {args.base}: {len(moved)} moved, {len(absent)} absent")
    print("SOURCES = {")
    for name, where in moved.items():
        print(f'    "{name}": "{where}",')
    print("}")
    print("ABSENT = {")
    for name, why in absent.items():
        print(f'    "{name}": "{why}",')
    print("}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
