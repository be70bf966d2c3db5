"""Reading the docs as the tests check them: fenced blocks, headings' anchors, relative links,
and the console examples (`$ COMMAND` lines followed by what the command printed)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TRIMMED = "..."
"""A line of its own (after leading spaces) where an example leaves out the rest of the output."""


@dataclass(frozen=True)
class Block:
    lang: str
    body: str
    """The lines between the fences, each ending with a newline."""


@dataclass(frozen=True)
class Example:
    command: str
    output: list[str]
    """The lines shown after `$ command`, up to the next `$` line or the block's end."""

    @property
    def trimmed(self) -> bool:
        return any(line.strip() == TRIMMED for line in self.output)

    def shown(self) -> list[str]:
        """The output lines before the first `...` (all of them when nothing is trimmed)."""
        lines = []
        for line in self.output:
            if line.strip() == TRIMMED:
                break
            lines.append(line)
        return lines


def split(text: str) -> tuple[list[str], list[Block]]:
    """The prose lines (outside fences) and the fenced blocks of a Markdown text."""
    prose: list[str] = []
    blocks: list[Block] = []
    fence: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        if fence is None and line.startswith("```"):
            fence = line[3:].strip()
            body = []
        elif fence is not None and line.startswith("```"):
            blocks.append(Block(fence, "".join(f"{b}\n" for b in body)))
            fence = None
        elif fence is not None:
            body.append(line)
        else:
            prose.append(line)
    return prose, blocks


def blocks(path: Path, lang: str) -> list[Block]:
    return [b for b in split(path.read_text())[1] if b.lang == lang]


def examples(path: Path) -> list[Example]:
    """Every `$ command` of the file's console blocks, with the output shown for it."""
    found: list[Example] = []
    for block in blocks(path, "console"):
        command: str | None = None
        output: list[str] = []
        for line in block.body.splitlines():
            if line.startswith("$ "):
                if command is not None:
                    found.append(Example(command, output))
                command, output = line[2:], []
            elif command is not None and not output and command.endswith("\\"):
                command = command[:-1].rstrip() + " " + line.strip()  # a continued command line
            else:
                output.append(line)
        if command is not None:
            found.append(Example(command, output))
    return found


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the file's headings (`## \\`pdkit up\\`` -> `pdkit-up`)."""
    found: set[str] = set()
    for line in split(path.read_text())[0]:
        match = re.match(r"#{1,6} (.+)", line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            anchor, n = slug, 0
            while anchor in found:
                n += 1
                anchor = f"{slug}-{n}"
            found.add(anchor)
    return found


def relative_links(path: Path) -> list[str]:
    """Targets of the file's Markdown links that are not URLs (`docs/lb.md#keys`, `#model`)."""
    prose = "\n".join(split(path.read_text())[0])
    targets = re.findall(r"\]\(([^)\s]+)\)", prose)
    return [t for t in targets if not re.match(r"[a-z]+:", t)]
