"""Errors of the PD load balancer, and the one JSON shape every client error takes.

    PdkitError                  (kit.errors)
    └── LbError                 the load balancer cannot start or run
        └── LbConfigError       a bad command line, key file or worker URL

    ApiError                    not a PdkitError: one failed client request; the server turns it
                                into an OpenAI-style JSON body with its HTTP status
    └── LegError                one leg (prefill or decode) of a PD request failed

`ApiError` never escapes to the client as a traceback: the server renders it with `body()`.
"""

from __future__ import annotations

import json

from kit.errors import PdkitError


class LbError(PdkitError):
    """The load balancer cannot start or keep running."""


class LbConfigError(LbError):
    """A command-line option, key file or worker URL is unusable; the message says how to fix it."""


# OpenAI error `type` values per HTTP status, for clients that switch on them.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "gateway_timeout",
}


def error_type(status: int) -> str:
    """OpenAI-style error type for an HTTP status."""
    return _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str, *, param: str | None = None) -> bytes:
    """The JSON body of an error response: ``{"error": {"message", "type", "param", "code"}}``."""
    payload = {
        "error": {"message": message, "type": error_type(status), "param": param, "code": status}
    }
    return json.dumps(payload).encode()


class ApiError(Exception):
    """A request that fails with `status`; `cause` is the low-cardinality metrics label.

    `raw_body` (with `raw_content_type`) is a worker's own error body, passed on unchanged when
    it is JSON, so that clients see SGLang's message. `headers` go on the response (e.g.
    Retry-After on a 429).
    """

    def __init__(
        self,
        status: int,
        message: str,
        cause: str,
        *,
        param: str | None = None,
        raw_body: bytes | None = None,
        raw_content_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.cause = cause
        self.param = param
        self.raw_body = raw_body
        self.raw_content_type = raw_content_type
        self.headers = headers

    def body(self) -> bytes:
        """The response body: the worker's JSON error when there is one, else ours."""
        if self.raw_body is not None and _is_json_object(self.raw_body, self.raw_content_type):
            return self.raw_body
        return error_body(self.status, self.message, param=self.param)

    def event(self) -> bytes:
        """The same error as one SSE event, for a stream that already started."""
        return b"data: " + error_body(self.status, self.message, param=self.param) + b"\n\n"


class LegError(ApiError):
    """One leg of a PD request failed.

    `role` is ``prefill`` or ``decode``; `worker` is the worker's URL. `unsent` is true when the
    request never left the load balancer (the connection could not be made). `blame` is the
    URL of the worker the failure counts against (outlier ejection): the leg's own worker,
    except a decode that failed while its prefill had not finished (SGLang's decode reports
    a prefill it lost: "Lost connection with prefill instance").
    """

    def __init__(
        self,
        status: int,
        message: str,
        cause: str,
        *,
        role: str,
        worker: str,
        unsent: bool = False,
        raw_body: bytes | None = None,
        raw_content_type: str | None = None,
        blame: str | None = None,
    ) -> None:
        super().__init__(
            status, message, cause, raw_body=raw_body, raw_content_type=raw_content_type
        )
        self.role = role
        self.worker = worker
        self.unsent = unsent
        self.blame = worker if blame is None else blame

    @property
    def retryable(self) -> bool:
        """Whether sending the request again elsewhere may succeed: the worker was not
        reached, or failed on its side (5xx, a broken connection, a timeout). A 4xx is the
        worker's verdict on the request and is passed on."""
        return self.unsent or self.status >= 500


def _is_json_object(body: bytes, content_type: str | None) -> bool:
    if content_type is not None and "json" not in content_type:
        return False
    stripped = body.lstrip()
    if not stripped.startswith(b"{"):
        return False
    try:
        return isinstance(json.loads(body), dict)
    except ValueError:
        return False
