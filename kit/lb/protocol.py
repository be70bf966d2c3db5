"""The PD request protocol as pure functions: read a client body, add the bootstrap fields.

SGLang's PD workers need, in the body sent to both legs, `bootstrap_host` (the prefill's host,
IPv6 in brackets), `bootstrap_port` (int, or null: decode uses its own default) and
`bootstrap_room` (a random int in [0, 2^63 - 1]; with `n > 1` the server uses R .. R+n-1). A
batched `/generate` (`text` a list, or `input_ids` a list of lists) gets lists of the batch
size, one room each. The same bytes go to both legs.

The client's JSON is parsed once (to validate it and read the few fields routing needs); when it
carries no bootstrap fields of its own, the fields are spliced in before the closing brace, so
a long prompt is never re-encoded.
"""

from __future__ import annotations

import enum
import functools
import json
import random
from dataclasses import dataclass
from typing import Any

import msgspec

from kit.lb.errors import ApiError

GENERATE = "/generate"
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
PD_ROUTES = (GENERATE, COMPLETIONS, CHAT)
_PATH_BYTES = {path: path.encode() for path in PD_ROUTES}

# Rooms leave headroom below 2^63 - 1 so that R + n - 1 stays in range for parallel samples.
ROOM_SPAN = 2**63 - 2**20
_BOOTSTRAP_KEYS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
_DECODE_JSON = msgspec.json.Decoder().decode


class Merge(enum.Enum):
    """Which prefill logprobs must be merged into the decode response."""

    NONE = "none"
    NATIVE = "native"  # /generate return_logprob: meta_info.input_* from prefill
    ECHO = "echo"  # /v1/completions echo + logprobs: the prompt part of choices[].logprobs


@dataclass(slots=True)
class PdRequest:
    """A validated client request for one of the PD routes."""

    path: str
    raw: bytes
    body: dict[str, Any]
    stream: bool
    batch_size: int | None
    merge: Merge
    spliceable: bool
    # The prompt's token ids as the workers will see them, when the router knows them (its
    # tokenizer, or ids the client sent): set once by the server, read by every use.
    ids: list[int] | None = None

    @property
    def path_bytes(self) -> bytes:
        return _PATH_BYTES[self.path]

    def encode(
        self,
        host: str,
        port: int | None,
        rng: random.Random,
        dp_rank: tuple[int, int] | None = None,
    ) -> tuple[bytes, int]:
        """The body for both legs, with fresh bootstrap fields (new rooms on every call), and
        its (first) bootstrap room; `dp_rank` (rank, dp size) picks a room with
        ``room % dp == rank``, the prefill DP rank SGLang's follow_bootstrap_room runs it on."""
        if self.batch_size is None:
            room = rng.getrandbits(63) % ROOM_SPAN
            if dp_rank is not None:
                room = room_on_rank(room, *dp_rank)
            if self.spliceable:
                return b'%s,%s,"bootstrap_room":%d}' % (
                    self.raw[: self.raw.rindex(b"}")],
                    _host_port(host, port),
                    room,
                ), room
            fields: dict[str, Any] = {
                "bootstrap_host": host,
                "bootstrap_port": port,
                "bootstrap_room": room,
            }
        else:
            rooms = [rng.getrandbits(63) % ROOM_SPAN for _ in range(self.batch_size)]
            room = rooms[0]
            fields = {
                "bootstrap_host": [host] * self.batch_size,
                "bootstrap_port": [port] * self.batch_size,
                "bootstrap_room": rooms,
            }
        if self.spliceable:
            tail = json.dumps(fields, separators=(",", ":")).encode()
            return self.raw[: self.raw.rindex(b"}")] + b"," + tail[1:], room
        body = dict(self.body)
        body.update(fields)
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode(), room


def room_on_rank(room: int, rank: int, dp_size: int) -> int:
    """The room nearest below `room` with ``room % dp_size == rank`` (within [0, ROOM_SPAN))."""
    if dp_size <= 1:
        return room
    room = room - room % dp_size + rank
    return room if room < ROOM_SPAN else room - dp_size


@functools.lru_cache(maxsize=1024)
def _host_port(host: str, port: int | None) -> bytes:
    """`"bootstrap_host":...,"bootstrap_port":...` as JSON, once per prefill."""
    return json.dumps(
        {"bootstrap_host": host, "bootstrap_port": port}, separators=(",", ":")
    ).encode()[1:-1]


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "bad_request", param=param)


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(f"'{name}' must be true or false, got {json.dumps(value)}", name)
    return value


def _check_n(value: Any, name: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise _bad(f"'{name}' must be a positive integer, got {json.dumps(value)}", name)


def _generate_shape(body: dict[str, Any]) -> tuple[int | None, Merge]:
    text, input_ids = body.get("text"), body.get("input_ids")
    batch: int | None = None
    if text is not None:
        if isinstance(text, list):
            if not text or not isinstance(text[0], str):
                raise _bad("'text' must be a string or a non-empty list of strings", "text")
            batch = len(text)
        elif not isinstance(text, str):
            raise _bad("'text' must be a string or a non-empty list of strings", "text")
    elif input_ids is not None:
        if not isinstance(input_ids, list) or not input_ids:
            raise _bad(
                "'input_ids' must be a non-empty list of token ids, or a list of such lists",
                "input_ids",
            )
        first = input_ids[0]
        if isinstance(first, list):
            batch = len(input_ids)
        elif isinstance(first, bool) or not isinstance(first, int):
            raise _bad("'input_ids' must hold integers or lists of integers", "input_ids")
    elif body.get("input_embeds") is None:
        raise _bad("/generate needs 'text' or 'input_ids'", "text")
    params = body.get("sampling_params")
    if params is not None:
        if not isinstance(params, dict):
            raise _bad("'sampling_params' must be an object", "sampling_params")
        _check_n(params.get("n"), "sampling_params.n")
    logprob = body.get("return_logprob")
    if isinstance(logprob, list):
        wants = any(bool(x) for x in logprob)
    elif logprob is None or isinstance(logprob, bool):
        wants = bool(logprob)
    else:
        raise _bad("'return_logprob' must be true, false or a list of them", "return_logprob")
    return batch, Merge.NATIVE if wants else Merge.NONE


def _completions_merge(body: dict[str, Any]) -> Merge:
    prompt = body.get("prompt")
    if prompt is None or (isinstance(prompt, list) and not prompt):
        raise _bad("/v1/completions needs a non-empty 'prompt'", "prompt")
    if not isinstance(prompt, str | list):
        raise _bad("'prompt' must be a string, a list of strings, or token ids", "prompt")
    _check_n(body.get("n"), "n")
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)):
        raise _bad("'logprobs' must be an integer for /v1/completions", "logprobs")
    return Merge.ECHO if _flag(body, "echo") and logprobs else Merge.NONE


def _check_chat(body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("/v1/chat/completions needs a non-empty 'messages' list", "messages")
    if not all(isinstance(m, dict) for m in messages):
        raise _bad("every entry of 'messages' must be an object", "messages")
    _check_n(body.get("n"), "n")
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise _bad("'logprobs' must be true or false for chat completions", "logprobs")


def _loads(raw: bytes) -> Any:
    """`json.loads`, a third of its CPU on a long prompt: msgspec's decoder gives the same
    values wherever it accepts the text (strict JSON in UTF-8); for what only json accepts (NaN,
    Infinity, 1e400, lone surrogates, a BOM, UTF-16) and for every error, json's own answer and
    message."""
    try:
        return _DECODE_JSON(raw)
    except msgspec.DecodeError:
        return json.loads(raw)


def parse_request(path: str, raw: bytes) -> PdRequest:
    """Validate a client body for `path`; raises ApiError(400) with the offending field."""
    if not raw.strip():
        raise _bad("the request body is empty; send a JSON object")
    try:
        body = _loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    stream = _flag(body, "stream")
    batch: int | None = None
    merge = Merge.NONE
    if path == GENERATE:
        batch, merge = _generate_shape(body)
    elif path == COMPLETIONS:
        merge = _completions_merge(body)
    else:
        _check_chat(body)
    stripped = raw.strip()
    spliceable = (
        stripped[:1] == b"{"
        and stripped[-1:] == b"}"
        and len(body) > 0
        and not any(key in body for key in _BOOTSTRAP_KEYS)
    )
    return PdRequest(path, stripped, body, stream, batch, merge, spliceable)


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    else:
        text = ""
    return f"{message.get('role', '')}:{text}\n"


def affinity_key(request: PdRequest, prefix_chars: int) -> bytes | None:
    """The prompt prefix that `prefix_affinity` hashes: `prefix_chars` characters of text, or a
    quarter as many token ids; the first prompt of a batch. None when there is no prompt."""
    body = request.body
    if request.path == CHAT:
        parts: list[str] = []
        size = 0
        for message in body["messages"]:
            piece = _message_text(message)
            parts.append(piece)
            size += len(piece)
            if size >= prefix_chars:
                break
        return "".join(parts)[:prefix_chars].encode()
    prompt = body.get("text") if request.path == GENERATE else body.get("prompt")
    if prompt is None and request.path == GENERATE:
        prompt = body.get("input_ids")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt[:prefix_chars].encode()
    if isinstance(prompt, list):
        ids = prompt[: max(prefix_chars // 4, 1)]
        return b"ids:" + ",".join(str(t) for t in ids).encode()
    return None
