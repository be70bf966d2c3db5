"""Greedy answers compared across prefill x decode pairs: the deploy gate's and `pdkit doctor`'s
token check (`kit.observe.doctor_tokens`) and the router's token canary (`kit.lb.canary`).

A KV cache that arrives altered (a wrong page layout, a bad NIC or PCIe path) is decoded
anyway: SGLang checks the KV only with `--disaggregation-enable-kv-checksum` (off by default),
so the answer is fluent, wrong, and comes with status 200 and no log line (sglang #12157). A
transfer that "worked" proves nothing about the tokens; comparing them does.

Answers are compared by their output token ids where the answer carries them (SGLang's and the
sim's `/generate` do), else by their text. The expected answer is a reference's, else the
majority's; with no majority (two pairs that disagree, or a tie) no pair can be called right,
so every pair that disagrees with another is named and the message asks for a reference.
Pure: the caller brings the answers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CHECK_TOKENS = 8
"""Output tokens per check request: the first comes from the prefill's own forward pass, the
rest from the decode reading the KV it received, so at least two are needed."""
SHOWN_TOKENS = 12


@dataclass(frozen=True)
class Answer:
    """What one request generated: its output token ids (None when the answer has none) and
    its text."""

    output_ids: tuple[int, ...] | None
    text: str

    @property
    def key(self) -> tuple[int, ...] | str:
        return self.output_ids if self.output_ids is not None else self.text

    def show(self) -> str:
        """The answer for a message: the ids (the first few) and the text."""
        text = self.text if len(self.text) <= 60 else self.text[:57] + "..."
        if self.output_ids is None:
            return repr(text)
        ids = list(self.output_ids[:SHOWN_TOKENS])
        more = "..." if len(self.output_ids) > SHOWN_TOKENS else ""
        return f"{str(ids)[:-1]}{more}] {text!r}"


def answer_from(data: Any) -> Answer | None:
    """The answer in a parsed `/generate` reply (one request; None when it has none)."""
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        return None
    ids = data.get("output_ids")
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        return Answer(tuple(ids), data["text"])
    return Answer(None, data["text"])


def first_difference(a: Answer, b: Answer) -> str:
    """Where two answers part: "from token N" (ids), or "in the text"."""
    if a.output_ids is None or b.output_ids is None:
        return "in the text"
    for i, (x, y) in enumerate(zip(a.output_ids, b.output_ids, strict=False)):
        if x != y:
            return f"from token {i}"
    return f"in length ({len(a.output_ids)} against {len(b.output_ids)} tokens)"


@dataclass(frozen=True)
class Expected:
    """The answer every pair must give and where it comes from (`source`, for messages; with
    no majority, how the pairs split); `answer` is None when there is none (no reference and
    no majority)."""

    answer: Answer | None
    source: str
    agree: int = 0
    compared: int = 0


def expected(
    answers: Mapping[str, Answer], reference: Answer | None, source: str = "the reference"
) -> Expected:
    """The reference's answer when there is one (named `source` in messages), else the
    majority's among `answers` (pair name -> answer)."""
    total = len(answers)
    if reference is not None:
        agree = sum(a.key == reference.key for a in answers.values())
        return Expected(reference, source, agree, total)
    counts = Counter(a.key for a in answers.values())
    if not counts:
        return Expected(None, "no pair answered")
    (top, n), *rest = counts.most_common()
    if rest and rest[0][1] == n:
        sizes = " vs ".join(str(c) for _, c in counts.most_common())
        return Expected(None, f"{sizes} of {total} pairs", 0, total)
    answer = next(a for a in answers.values() if a.key == top)
    return Expected(answer, f"the majority ({n} of {total} pairs)", n, total)


def disagreements(answers: Mapping[str, Answer], want: Expected) -> dict[str, str]:
    """pair name -> what it gave against what was expected, for each pair that disagrees."""
    out: dict[str, str] = {}
    if want.answer is None:
        if len({a.key for a in answers.values()}) <= 1:
            return out
        for name, answer in answers.items():
            out[name] = (
                f"the pairs disagree and none has a majority ({want.source}); this one gave "
                f"{answer.show()}. To tell which is right: pass --reference URL (a colocated "
                "server of the same model)"
            )
        return out
    for name, answer in answers.items():
        if answer.key != want.answer.key:
            out[name] = (
                f"gave other tokens than {want.source}, {first_difference(answer, want.answer)}: "
                f"{answer.show()} against {want.answer.show()}"
            )
    return out


def suspects(wrong: set[str], pairs: Mapping[str, tuple[str, str]]) -> list[str]:
    """Workers every one of whose pairs is wrong while some pair elsewhere is right: the
    likely culprits (`pairs`: pair name -> (prefill, decode))."""
    if not wrong or len(wrong) == len(pairs):
        return []
    out = []
    for worker in dict.fromkeys(w for both in pairs.values() for w in both):
        mine = [name for name, both in pairs.items() if worker in both]
        if mine and all(name in wrong for name in mine):
            out.append(worker)
    return out
