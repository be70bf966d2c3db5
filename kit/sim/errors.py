"""Refusals of a request, and where in SGLang's path each is made (that decides its shape).

SGLang 0.5.23 refuses a bad request at one of three places before the scheduler, and each
answers in its own way (sglang/srt/entrypoints/http_server.py):

- `Stage.SCHEMA`: FastAPI cannot parse the body into the route's type (bad JSON, a wrong
  type, a failed pydantic validator): 400, an OpenAI ``ErrorResponse`` of type "Bad Request".
- `Stage.CONTRACT`: ``/generate`` only, the JSON contract check: 400, ``{"error": "<text>"}``.
- `Stage.REQUEST`: the serving class or the tokenizer manager refuses it (empty prompt, a
  sampling parameter out of range, too many tokens): 400, an ``ErrorResponse`` on the OpenAI
  routes, ``{"error": {"message": ...}}`` on ``/generate``; a streamed ``/generate`` has
  answered 200 already and sends the error as a stream event.

What the scheduler refuses later is not a `RequestRefused`: the request finishes with an abort
(`RequestState.fail`), which a stream reports inside the stream.
"""

from __future__ import annotations

from enum import Enum


class Stage(Enum):
    SCHEMA = "schema"
    CONTRACT = "contract"
    REQUEST = "request"


class RequestRefused(ValueError):
    """A request SGLang would refuse; `status` is the HTTP status, `stage` where it is
    refused."""

    def __init__(self, message: str, status: int = 400, stage: Stage = Stage.REQUEST) -> None:
        super().__init__(message)
        self.status = status
        self.stage = stage
