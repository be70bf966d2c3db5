"""Synthetic workloads for virtual-time runs: requests with an arrival time and lengths.

A sweep takes a `WorkloadFactory`, ``rate -> requests``, so that callers choose the length
distribution and the arrival process; `fixed_poisson` is the common case (fixed lengths,
Poisson arrivals).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from kit.errors import PdkitError
from kit.topology.schema import SLO


@dataclass(frozen=True)
class Request:
    """One synthetic request: arrival (s from the start), prompt and output lengths (tokens)."""

    arrival: float
    prompt_len: int
    output_len: int
    hash_ids: tuple[int, ...] = ()
    """The prompt's blocks (a trace's hash ids): requests sharing leading blocks share a
    prompt prefix."""
    cached_tokens: int = 0
    """Prompt tokens its prefill takes from a cache instead of computing (a PD cluster's
    prefill starts with them computed, as the sim's HiCache does)."""
    pool_tokens: int = 0
    """Of those, tokens loaded from the KV pool first, over the pool's link."""


WorkloadFactory = Callable[[float], Sequence[Request]]
"""The requests to serve at a rate (requests/s), in arrival order."""


def poisson_arrivals(
    rate: float, lengths: Iterable[tuple[int, int]], seed: int = 0
) -> list[Request]:
    """One request per (prompt, output) length pair, with exponential inter-arrival times at
    `rate` requests/s. The same seed gives the same gaps (scaled by 1/rate) at every rate."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0 requests/s, not {rate}")
    rng = random.Random(seed)
    t = 0.0
    out = []
    for prompt_len, output_len in lengths:
        t += rng.expovariate(rate)
        out.append(Request(t, prompt_len, output_len))
    return out


def poisson_workload(
    rate: float, count: int, prompt_len: int, output_len: int, seed: int = 0
) -> list[Request]:
    """`count` requests of fixed lengths (tokens), Poisson arrivals at `rate` requests/s."""
    return poisson_arrivals(rate, [(prompt_len, output_len)] * count, seed)


def fixed_poisson(
    prompt_len: int, output_len: int, *, requests: int = 1000, seed: int = 0
) -> WorkloadFactory:
    """A factory of `requests` requests of fixed lengths (tokens) arriving as a Poisson
    process at the rate asked."""

    def at(rate: float) -> list[Request]:
        return poisson_workload(rate, requests, prompt_len, output_len, seed)

    return at


# -- workloads as users describe them: length distributions, arrival processes, traces -------

LengthKind = Literal["fixed", "uniform", "normal", "lognormal", "histogram"]
ArrivalKind = Literal["poisson", "gamma", "constant"]
STEADY_LIFETIMES = 3.0
"""Request lifetimes (`WorkloadSpec.lifetime_s`) of arrivals a point needs to show a rate's
steady state: `pdkit size` serves at least that many, `pdkit bench --search` warns below it."""

TRACE_BLOCK_TOKENS = 512
"""Tokens per `hash_ids` block in the Mooncake trace format."""


@dataclass(frozen=True)
class Lengths:
    """A distribution of token counts (at least 1 each).

    Written as `512` (fixed), `uniform:256,1024` (inclusive), `normal:512,64` (mean, standard
    deviation), `lognormal:512,0.5` (mean, sigma of the underlying normal) or `hist:FILE` (a
    file of `length weight` lines, or `length` lines of equal weight)."""

    kind: LengthKind
    a: float = 0.0
    b: float = 0.0
    values: tuple[int, ...] = ()
    weights: tuple[float, ...] = ()
    source: str = ""

    @classmethod
    def fixed(cls, tokens: int) -> Lengths:
        return cls("fixed", float(tokens))

    @classmethod
    def parse(cls, text: str, option: str = "length") -> Lengths:
        """`text` as written above; `WorkloadError` naming `option` when it is not."""
        kind, sep, rest = text.strip().partition(":")
        try:
            if not sep:
                value = int(kind)
                if value < 1:
                    raise ValueError
                return cls.fixed(value)
            if kind in ("uniform", "normal", "lognormal"):
                a_text, _, b_text = rest.partition(",")
                a, b = float(a_text), float(b_text)
                if kind == "uniform" and not 1 <= a <= b:
                    raise ValueError
                if kind != "uniform" and (a < 1 or b < 0):
                    raise ValueError
                return cls(kind, a, b)  # type: ignore[arg-type]
            if kind == "hist":
                return cls._histogram(Path(rest), option)
        except (ValueError, OSError) as exc:
            if isinstance(exc, WorkloadError):
                raise
        raise WorkloadError(
            f"{option} {text!r} is not a length distribution. To fix: write 512, "
            "uniform:256,1024, normal:512,64, lognormal:512,0.5 or hist:FILE (token counts)."
        )

    @classmethod
    def _histogram(cls, path: Path, option: str) -> Lengths:
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise WorkloadError(
                f"{option} hist:{path}: cannot read the file ({exc.strerror}). To fix: check "
                "the path."
            ) from exc
        values: list[int] = []
        weights: list[float] = []
        for number, line in enumerate(lines, 1):
            fields = line.replace(",", " ").split()
            if not fields or fields[0].startswith("#"):
                continue
            try:
                value = int(fields[0])
                weight = float(fields[1]) if len(fields) > 1 else 1.0
                if value < 1 or weight < 0:
                    raise ValueError
            except ValueError:
                raise WorkloadError(
                    f"{option} hist:{path}:{number}: {line.strip()!r} is not `length [weight]`. "
                    "To fix: one token count (>= 1) and an optional weight (>= 0) per line."
                ) from None
            values.append(value)
            weights.append(weight)
        if not values or sum(weights) <= 0:
            raise WorkloadError(
                f"{option} hist:{path}: no lengths with a weight. To fix: add some."
            )
        return cls("histogram", values=tuple(values), weights=tuple(weights), source=str(path))

    def sample(self, rng: random.Random) -> int:
        """One length (tokens, >= 1)."""
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        if self.kind == "normal":
            return max(1, round(rng.gauss(self.a, self.b)))
        if self.kind == "lognormal":
            mu = math.log(self.a) - self.b**2 / 2
            return max(1, round(rng.lognormvariate(mu, self.b)))
        return rng.choices(self.values, self.weights)[0]

    @property
    def mean(self) -> float:
        """The mean length (tokens), before the clipping at 1."""
        if self.kind == "histogram":
            total = sum(self.weights)
            return sum(v * w for v, w in zip(self.values, self.weights, strict=True)) / total
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        return self.a

    def describe(self) -> str:
        if self.kind == "fixed":
            return str(int(self.a))
        if self.kind == "histogram":
            return f"hist:{self.source} (mean {self.mean:.0f})"
        return f"{self.kind}:{self.a:g},{self.b:g}"


@dataclass(frozen=True)
class Arrivals:
    """How requests arrive at a rate: `poisson`, `gamma:B` (gamma-distributed gaps with
    burstiness B: shape B, so B < 1 is burstier than Poisson and B = 1 is Poisson) or
    `constant` (evenly spaced)."""

    kind: ArrivalKind = "poisson"
    burstiness: float = 1.0

    @classmethod
    def parse(cls, text: str) -> Arrivals:
        kind, sep, rest = text.strip().partition(":")
        if kind in ("poisson", "constant") and not sep:
            return cls(kind)  # type: ignore[arg-type]
        if kind == "gamma":
            try:
                burstiness = float(rest) if sep else 1.0
            except ValueError:
                burstiness = 0.0
            if burstiness > 0:
                return cls("gamma", burstiness)
        raise WorkloadError(
            f"--arrivals {text!r} is not an arrival process. To fix: use poisson, constant or "
            "gamma:B with a burstiness B > 0 (1 is Poisson, below 1 burstier)."
        )

    def gaps(self, rate: float, count: int, rng: random.Random) -> list[float]:
        """`count` gaps between arrivals (s) averaging 1/rate."""
        if rate <= 0:
            raise WorkloadError(f"the request rate must be > 0 requests/s, not {rate:g}.")
        if self.kind == "constant":
            return [1.0 / rate] * count
        if self.kind == "gamma":
            shape = self.burstiness
            return [rng.gammavariate(shape, 1.0 / (rate * shape)) for _ in range(count)]
        return [rng.expovariate(rate) for _ in range(count)]

    def describe(self) -> str:
        return f"gamma:{self.burstiness:g}" if self.kind == "gamma" else self.kind


@dataclass(frozen=True)
class TraceEntry:
    """One line of a Mooncake-format trace: arrival (s from the trace's start), lengths
    (tokens) and the prompt's block hashes (blocks of `TRACE_BLOCK_TOKENS` tokens)."""

    timestamp: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...] = ()


def read_trace(path: str | Path) -> list[TraceEntry]:
    """A JSONL trace (`timestamp` ms, `input_length`, `output_length`, optional `hash_ids`),
    sorted by time; `WorkloadError` naming the line for anything else."""
    file = Path(path)
    try:
        lines = file.read_text().splitlines()
    except OSError as exc:
        raise WorkloadError(
            f"--trace {file}: cannot read the file ({exc.strerror}). To fix: check the path."
        ) from exc
    entries = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            entries.append(
                TraceEntry(
                    float(row["timestamp"]) / 1000.0,
                    max(1, int(row["input_length"])),
                    max(1, int(row["output_length"])),
                    tuple(int(h) for h in row.get("hash_ids") or ()),
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise WorkloadError(
                f"--trace {file}:{number}: not a trace record ({exc!r}). To fix: each line is "
                'JSON like {"timestamp": 0, "input_length": 512, "output_length": 64, '
                '"hash_ids": [1, 2]} (timestamp in ms).'
            ) from None
    if not entries:
        raise WorkloadError(f"--trace {file}: no records. To fix: give a non-empty JSONL trace.")
    start = min(e.timestamp for e in entries)
    return sorted((replace(e, timestamp=e.timestamp - start) for e in entries), key=_at)


def _at(entry: TraceEntry) -> float:
    return entry.timestamp


def multi_turn_hash_ids(conversations: int, turns: int, seed: int) -> list[tuple[int, ...]]:
    """A Mooncake-style trace's prompts as `hash_ids` (blocks of `TRACE_BLOCK_TOKENS`):
    `conversations` conversations share a 4-block system prompt by pairs; each of their
    `turns` turns repeats the conversation's previous blocks and adds one, as a chat history
    does; turns of different conversations interleave at random (`seed`)."""
    rng = random.Random(seed)
    next_id = 1000
    histories = [list(range(100 + 4 * (c // 2), 104 + 4 * (c // 2))) for c in range(conversations)]
    order = [c for c in range(conversations) for _ in range(turns)]
    rng.shuffle(order)
    prompts = []
    for c in order:
        histories[c] = [*histories[c], next_id]
        next_id += 1
        prompts.append(tuple(histories[c]))
    return prompts


@dataclass(frozen=True)
class WorkloadSpec:
    """A reproducible workload: `count` requests whose lengths come from `input`/`output` (or
    a `trace`), arriving by `arrivals` at whatever rate is asked. The same seed gives the same
    lengths at every rate, and gaps that only scale with 1/rate."""

    input: Lengths = field(default_factory=lambda: Lengths.fixed(512))
    output: Lengths = field(default_factory=lambda: Lengths.fixed(64))
    arrivals: Arrivals = field(default_factory=Arrivals)
    count: int = 200
    seed: int = 0
    trace: tuple[TraceEntry, ...] = ()

    @classmethod
    def from_options(
        cls,
        *,
        input_len: str,
        output_len: str,
        arrivals: str,
        trace: Path | None,
        count: int,
        seed: int,
    ) -> WorkloadSpec:
        """The workload `pdkit bench` and `pdkit size` take as `--input-len`, `--output-len`,
        `--arrivals`, `--trace`, `--requests` and `--seed`; `WorkloadError` naming the option
        that is wrong."""
        return cls(
            input=Lengths.parse(input_len, "--input-len"),
            output=Lengths.parse(output_len, "--output-len"),
            arrivals=Arrivals.parse(arrivals),
            count=count,
            seed=seed,
            trace=tuple(read_trace(trace)) if trace else (),
        )

    @property
    def native_rate(self) -> float | None:
        """A trace's own mean rate (requests/s), None without a trace (or a zero-length one)."""
        if len(self.trace) < 2 or self.trace[-1].timestamp <= 0:
            return None
        return (len(self.trace) - 1) / self.trace[-1].timestamp

    def requests(self, rate: float | None) -> list[Request]:
        """The requests at `rate` (requests/s), in arrival order. A trace keeps its own shape,
        its timestamps scaled to `rate` (None: as recorded); its first `count` entries are
        used. `rate` None without a trace: all arrive at once (a closed loop paces them)."""
        rng = random.Random(self.seed)
        if self.trace:
            entries = self.trace[: self.count]
            native = self.native_rate
            scale = native / rate if rate and native else 1.0
            return [
                Request(e.timestamp * scale, e.input_len, e.output_len, e.hash_ids) for e in entries
            ]
        lengths = [(self.input.sample(rng), self.output.sample(rng)) for _ in range(self.count)]
        if rate is None:
            return [Request(0.0, p, o) for p, o in lengths]
        gap_rng = random.Random(f"{self.seed}:arrivals")
        t = 0.0
        out = []
        for (prompt, output), gap in zip(
            lengths, self.arrivals.gaps(rate, self.count, gap_rng), strict=True
        ):
            t += gap
            out.append(Request(t, prompt, output))
        return out

    def lifetime_s(self, slo: SLO) -> float:
        """The longest life (s) of a request that meets `slo`: its TTFT objective plus the
        mean output length x the TPOT objective. A point shorter than a few lifetimes ends
        before the batch reaches its steady size, and attains more than the rate sustains."""
        if self.trace:
            outputs = [e.output_len for e in self.trace[: self.count]]
            mean_output = sum(outputs) / len(outputs)
        else:
            mean_output = self.output.mean
        return slo.ttft_ms / 1000 + max(mean_output - 1, 0) * slo.tpot_ms / 1000

    def factory(self) -> WorkloadFactory:
        """This workload as a sweep's `rate -> requests`."""
        return self.requests

    def describe(self) -> str:
        if self.trace:
            return f"trace of {len(self.trace)} requests, first {min(self.count, len(self.trace))}"
        return (
            f"{self.count} requests, input {self.input.describe()}, output "
            f"{self.output.describe()} tokens, {self.arrivals.describe()} arrivals, "
            f"seed {self.seed}"
        )


class WorkloadError(PdkitError):
    """A workload that cannot be built (a bad distribution, file or trace line)."""
