"""One request as the client saw it, and where it went: a line of `requests.jsonl`.

Times are milliseconds; `sent_s` and `scheduled_s` are seconds from the start of the rate
point. `status` is the HTTP status (0: no answer at all). `prefill`, `decode` and
`bootstrap_room` come from pdkit's router (response headers, or its `/requests` record for a
request that got no answer); other targets leave them empty.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from kit.topology.schema import SLO


@dataclass(slots=True)
class RequestRecord:
    index: int
    rate: float | None
    """Offered rate (requests/s) of the point it belongs to; None in a closed loop."""
    warmup: bool
    input_tokens: int
    output_tokens: int
    scheduled_s: float = 0.0
    sent_s: float = 0.0
    send_lag_ms: float = 0.0
    status: int = 0
    ok: bool = False
    error: str = ""
    error_kind: str = ""
    """timeout, refused, unreachable, broken, http, stream (an error event mid-stream), empty
    (a 200 with no generated token)."""
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    """What the server counted (usage.prompt_tokens)."""
    cached_tokens: int | None = None
    """Prompt tokens the server took from a cache (usage.prompt_tokens_details.cached_tokens,
    with SGLang's --enable-cache-report); None: not reported."""
    cached_device: int | None = None
    """Of those, found on the prefill instance (GPU and host memory: device + host)."""
    cached_storage: int | None = None
    """Of those, loaded from the KV pool (HiCache L3: storage)."""
    completion_tokens: int = 0
    request_id: str = ""
    prefill: str = ""
    decode: str = ""
    bootstrap_room: int | None = None
    group: int | None = None

    def meets(self, slo: SLO) -> bool:
        """Answered, with TTFT and TPOT within the objective (errors and timeouts miss)."""
        return (
            self.ok
            and self.ttft_ms is not None
            and self.ttft_ms <= slo.ttft_ms
            and (self.tpot_ms or 0.0) <= slo.tpot_ms
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["itl_ms"] = [round(x, 3) for x in self.itl_ms]
        for key in ("ttft_ms", "tpot_ms", "e2e_ms", "send_lag_ms"):
            if data[key] is not None:
                data[key] = round(data[key], 3)
        for key in ("scheduled_s", "sent_s"):
            data[key] = round(data[key], 4)
        return data


_FIELDS = {f.name for f in fields(RequestRecord)}


def write_records(path: Path, records: Iterable[RequestRecord]) -> int:
    """Write one JSON line per record; returns how many."""
    count = 0
    with path.open("w") as out:
        for record in records:
            out.write(json.dumps(record.to_json(), separators=(",", ":")) + "\n")
            count += 1
    return count


def read_records(path: Path) -> Iterator[RequestRecord]:
    """The records of a `requests.jsonl` (unknown keys ignored)."""
    with path.open() as source:
        for line in source:
            if line.strip():
                data = json.loads(line)
                yield RequestRecord(**{k: v for k, v in data.items() if k in _FIELDS})
