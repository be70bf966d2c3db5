"""What a server says on the wire, reduced to what must match between the sim and SGLang: the
status, the content type, the JSON shape (keys and value types, not values), a stream's chunk
format, and `/metrics` names and labels. `differences` lists where two observations part, each
as a stable id ``CASE|ASPECT|DETAIL`` that a list of known differences can match (fnmatch).

Only the standard library: used by tests/e2e/real_sglang/test_sim_wire_fidelity.py against a
real SGLang server and a sim worker side by side.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

Shape = dict[str, str]
"""JSON path -> type name ("int", "str", "null", "dict", "list", ...); lists by their items."""


def shape(value: Any, path: str = "$") -> Shape:
    """Every path in `value` with its type; a list's items share the path `path[]`."""
    out: Shape = {path: _type(value)}
    if isinstance(value, dict):
        for key, item in value.items():
            # OpenAI's top_logprobs maps token texts to numbers: a value, not a key.
            name = "<token>" if path.endswith("top_logprobs[]") else key
            if key == "finish_reason" and (item is None or isinstance(item, str)):
                # Null until a choice ends, which chunk that is depends on timing: with tokens
                # made faster than sent, the first chunk may already end a 2-token stream.
                out[f"{path}.{name}"] = "str|null"
                continue
            out.update(shape(item, f"{path}.{name}"))
    elif isinstance(value, list):
        for item in value[:3]:
            for sub, kind in shape(item, f"{path}[]").items():
                out[sub] = kind if out.get(sub, kind) == kind else "mixed"
    return out


def _type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"  # SGLang writes 0 and 0.0 alike for some figures; the kind matters
    return type(value).__name__


@dataclass
class Observed:
    """One answer: status, content type, JSON shape (or a stream's chunks' shapes), text."""

    status: int
    content_type: str
    text: str
    shape: Shape | None = None
    stream: list[Shape] = field(default_factory=list)
    stream_format: str = ""
    message: str = ""


def send(
    url: str, method: str = "GET", payload: str | None = None, timeout: float = 60
) -> Observed:
    """One request; never raises for an HTTP status."""
    data = payload.encode() if payload is not None else None
    request = urllib.request.Request(
        url, data, {"Content-Type": "application/json"} if data else {}, method=method
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            status, headers, raw = answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as exc:
        status, headers, raw = exc.code, exc.headers, exc.read()
    text = raw.decode("utf-8", errors="replace")
    kind = (headers.get("Content-Type") or "").split(";")[0].strip()
    seen = Observed(status, kind, text)
    if kind == "text/event-stream" or text.startswith("data:"):
        _stream(seen)
    else:
        try:
            body = json.loads(text)
        except ValueError:
            return seen
        seen.shape = shape(body)
        seen.message = error_message(body)
    return seen


def _stream(seen: Observed) -> None:
    events = [line for line in seen.text.split("\n") if line.strip()]
    bad = [line for line in events if not line.startswith("data: ")]
    done = bool(events) and events[-1] == "data: [DONE]"
    seen.stream_format = f"data-lines={not bad} done-last={done}"
    for line in events:
        if line.startswith("data: ") and line != "data: [DONE]":
            try:
                chunk = json.loads(line[len("data: ") :])
            except ValueError:
                seen.stream.append({"$": "unparsable"})
                continue
            seen.stream.append(shape(chunk))
            seen.message = seen.message or error_message(chunk)


def error_message(body: Any) -> str:
    """SGLang's error text in any of its shapes ({"error": {"message"}}, {"message"}, ...)."""
    if not isinstance(body, dict):
        return ""
    error = body.get("error")
    if isinstance(error, dict):
        return str(error.get("message", ""))
    if isinstance(error, str):
        return error
    if isinstance(body.get("message"), str):
        return str(body["message"])
    detail = body.get("detail")
    if detail is not None:
        return json.dumps(detail)
    finish = (body.get("meta_info") or {}).get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        return str(finish.get("message", ""))
    return ""


def differences(case: str, real: Observed, sim: Observed, names: str | None = None) -> list[str]:
    """Where `sim` answers otherwise than `real`, as ``CASE|ASPECT|DETAIL`` ids."""
    out = []
    if real.status != sim.status:
        out.append(f"{case}|status|real {real.status} sim {sim.status}")
    if real.content_type != sim.content_type:
        out.append(f"{case}|content-type|real {real.content_type} sim {sim.content_type}")
    if real.stream_format != sim.stream_format:
        out.append(f"{case}|stream|real {real.stream_format!r} sim {sim.stream_format!r}")
    if real.shape is not None and sim.shape is not None:
        out += _shape_diff(case, "body", real.shape, sim.shape)
    elif (real.shape is None) != (sim.shape is None) and not (real.stream or sim.stream):
        out.append(f"{case}|body|real {_kind(real)} sim {_kind(sim)}")
    if real.stream and sim.stream:
        out += _shape_diff(case, "first-chunk", real.stream[0], sim.stream[0])
        out += _shape_diff(case, "last-chunk", real.stream[-1], sim.stream[-1])
    if names and real.status != 200:
        for who, seen in (("real", real), ("sim", sim)):
            if names.lower() not in seen.message.lower():
                out.append(f"{case}|message|{who} does not name {names!r}")
    return out


def _kind(seen: Observed) -> str:
    return "json" if seen.shape is not None else repr(seen.text[:60])


def _shape_diff(case: str, part: str, real: Shape, sim: Shape) -> list[str]:
    out = []
    for path in sorted(set(real) | set(sim)):
        if path not in sim:
            if not _under_missing(path, real, sim):
                out.append(f"{case}|{part}|{path} only in real")
        elif path not in real:
            if not _under_missing(path, sim, real):
                out.append(f"{case}|{part}|{path} only in sim")
        elif real[path] != sim[path]:
            out.append(f"{case}|{part}|{path} real {real[path]} sim {sim[path]}")
    return out


def _under_missing(path: str, have: Shape, other: Shape) -> bool:
    """True when a parent of `path` is already reported missing (one line per subtree)."""
    parent = re.sub(r"(\.[^.\[]+|\[\])$", "", path)
    return parent != path and parent in have and parent not in other


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s")


def metric_families(text: str) -> dict[str, str]:
    """`/metrics`: family name -> type, from the # TYPE lines."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)", text, re.M))


def metric_labels(text: str) -> dict[str, frozenset[str]]:
    """`/metrics`: family name -> the label names its samples carry (le/quantile left out)."""
    families = metric_families(text)
    out: dict[str, set[str]] = {name: set() for name in families}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or line.startswith("#"):
            continue
        name = match.group(1)
        family = next(
            (
                name[: -len(s)]
                for s in ("_bucket", "_sum", "_count", "_total", "_created")
                if name.endswith(s) and name[: -len(s)] in families
            ),
            name,
        )
        labels = {part.split("=", 1)[0] for part in (match.group(2) or "").split(",") if part}
        out.setdefault(family, set()).update(labels - {"le", "quantile"})
    return {name: frozenset(labels) for name, labels in out.items()}
