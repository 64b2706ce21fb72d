"""Ivy's one error type and the one table that maps it to HTTP.

Everything a client can get wrong, and every way a replica can fail, ends as an `IvyError` carrying a
`Problem` (the row of the table), a message naming the field and the limit, and optionally the field
path (`param`). The HTTP status and the OpenAI error type come only from `PROBLEMS`; the body is always
OpenAI's ``{"error": {"message", "type", "param", "code"}}``. Messages never quote request text.
"""

from __future__ import annotations

import enum
import math
from typing import Any, Sequence

import grpc
import orjson
from starlette.responses import Response


class Problem(enum.Enum):
    EMPTY_INPUT = "empty_input"
    INVALID_JSON = "invalid_json"
    INVALID_UTF8 = "invalid_utf8"
    INVALID_PARAMETER = "invalid_parameter"  # pydantic validation and our own checks
    TOO_MANY_INPUTS = "too_many_inputs"
    INPUT_TOO_LONG = "input_too_long"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    UNSUPPORTED_ENCODING = "unsupported_content_encoding"
    MODEL_NOT_FOUND = "model_not_found"
    UNSUPPORTED_TASK = "unsupported_task"  # the route needs a task the served model does not do (embed, rerank)
    UNAUTHORIZED = "invalid_api_key"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    OVERLOADED = "overloaded"  # Ivy's own concurrency cap
    REPLICA_BUSY = "replica_queue_full"  # Tulip's queue is full (RESOURCE_EXHAUSTED)
    DEADLINE_UNMEETABLE = "deadline_unmeetable"  # Tulip: the work queued ahead in the lane outlasts the deadline
    MESSAGE_TOO_LARGE = "message_too_large"  # a gRPC message over the size limit
    DEADLINE_EXCEEDED = "deadline_exceeded"
    UNAVAILABLE = "replicas_unavailable"
    CLIENT_CLOSED = "client_closed_request"
    BODY_TIMEOUT = "request_body_timeout"  # the body did not arrive in time (slow or stalled client)
    HEADER_TIMEOUT = "request_header_timeout"  # the headers did not arrive in time (ivy.connections)
    HEADERS_TOO_LARGE = "request_headers_too_large"  # request line + headers over the limit (ivy.connections)
    TOO_MANY_CONNECTIONS = "too_many_connections"  # over the open-connection cap (ivy.connections)
    BACKEND_ERROR = "backend_error"
    INTERNAL = "internal_error"


# Problem -> (HTTP status, OpenAI error type). The only place statuses are decided.
PROBLEMS: dict[Problem, tuple[int, str]] = {
    Problem.EMPTY_INPUT: (400, "invalid_request_error"),
    Problem.INVALID_JSON: (400, "invalid_request_error"),
    Problem.INVALID_UTF8: (400, "invalid_request_error"),
    Problem.INVALID_PARAMETER: (422, "invalid_request_error"),
    Problem.TOO_MANY_INPUTS: (422, "invalid_request_error"),
    Problem.INPUT_TOO_LONG: (422, "invalid_request_error"),
    Problem.PAYLOAD_TOO_LARGE: (413, "invalid_request_error"),
    Problem.UNSUPPORTED_ENCODING: (415, "invalid_request_error"),
    Problem.MODEL_NOT_FOUND: (404, "invalid_request_error"),
    Problem.UNSUPPORTED_TASK: (400, "invalid_request_error"),
    Problem.UNAUTHORIZED: (401, "authentication_error"),
    Problem.NOT_FOUND: (404, "invalid_request_error"),
    Problem.METHOD_NOT_ALLOWED: (405, "invalid_request_error"),
    Problem.OVERLOADED: (429, "rate_limit_error"),
    Problem.REPLICA_BUSY: (429, "rate_limit_error"),
    Problem.DEADLINE_UNMEETABLE: (429, "rate_limit_error"),
    Problem.MESSAGE_TOO_LARGE: (413, "invalid_request_error"),
    Problem.DEADLINE_EXCEEDED: (504, "timeout_error"),
    Problem.BODY_TIMEOUT: (408, "timeout_error"),
    Problem.HEADER_TIMEOUT: (408, "timeout_error"),
    Problem.HEADERS_TOO_LARGE: (431, "invalid_request_error"),
    Problem.TOO_MANY_CONNECTIONS: (503, "service_unavailable_error"),
    Problem.UNAVAILABLE: (503, "service_unavailable_error"),
    Problem.CLIENT_CLOSED: (499, "invalid_request_error"),
    Problem.BACKEND_ERROR: (502, "server_error"),
    Problem.INTERNAL: (500, "server_error"),
}

RETRY_AFTER_S = {Problem.OVERLOADED: 1, Problem.REPLICA_BUSY: 1, Problem.DEADLINE_UNMEETABLE: 1, Problem.UNAVAILABLE: 2,
                 Problem.TOO_MANY_CONNECTIONS: 1}
MAX_RETRY_AFTER_S = 3600  # an estimate is capped here: a wild one must not park a client for a day


class IvyError(Exception):
    """A failure with its row in PROBLEMS, a message that names the field and limit, and the field path."""

    def __init__(self, problem: Problem, message: str, param: str | None = None, limit: int | float | None = None,
                 retry_after_s: float | None = None):
        super().__init__(message)
        self.problem = problem
        self.message = message
        self.param = param
        self.limit = limit
        self.retry_after_s = retry_after_s  # an estimate (Tulip's) that replaces RETRY_AFTER_S's constant

    @property
    def status(self) -> int:
        return PROBLEMS[self.problem][0]

    def retry_after(self) -> int:
        """Retry-After in whole seconds (HTTP's delay-seconds): the estimate rounded up, at least 1, when one
        came with the error, else the problem's constant."""
        if self.retry_after_s is not None and self.retry_after_s == self.retry_after_s:  # not nan
            return max(1, math.ceil(min(self.retry_after_s, MAX_RETRY_AFTER_S)))
        return RETRY_AFTER_S[self.problem]

    def to_response(self) -> Response:
        status, kind = PROBLEMS[self.problem]
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.problem.value}}
        headers = {}
        if self.problem in RETRY_AFTER_S:
            headers["Retry-After"] = str(self.retry_after())
        if self.problem is Problem.UNAUTHORIZED:
            headers["WWW-Authenticate"] = "Bearer"
        if self.problem is Problem.BODY_TIMEOUT:
            headers["Connection"] = "close"  # the rest of the body may still trickle in: drop the connection
        return Response(orjson.dumps(body), status_code=status, headers=headers, media_type="application/json")


def field_path(loc: Sequence[Any]) -> str:
    """('input', 0, 'text') -> 'input[0].text'; the empty path is the body itself."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out or "body"


def from_validation_errors(errors: Sequence[dict[str, Any]]) -> IvyError:
    """The first pydantic error as a 422 naming its field path (never the offending value)."""
    first = errors[0]
    path = field_path(first.get("loc", ()))
    if path == "body" and first.get("type") in ("model_type", "dict_type", "model_attributes_type"):
        return IvyError(Problem.INVALID_PARAMETER, "the body must be a JSON object", param="body")
    return IvyError(Problem.INVALID_PARAMETER, f"{path}: {first.get('msg', 'invalid value')}", param=path)


_MESSAGE_SIZE_MARKERS = ("larger than max", "message too large", "max message size")


def from_grpc(code: grpc.StatusCode, details: str | None, replica: str, reason: str = "",
              retry_after_s: float | None = None) -> IvyError:
    """Map a replica's gRPC status to an IvyError (RELIABILITY cases 14, 17, 22). `reason` is Tulip's
    "tulip-reason" trailing metadata, which tells apart errors sharing a status; gRPC's own message-size
    errors carry none, so their text is checked too. `retry_after_s` is Tulip's estimate of when a retry
    could succeed ("tulip-retry-after-s"; deadline_unmeetable: the wait ahead in the lane): the Retry-After."""
    details = details or ""
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if reason == "response_too_large" or any(m in details.lower() for m in _MESSAGE_SIZE_MARKERS):
            return IvyError(Problem.MESSAGE_TOO_LARGE,
                            "the request is larger than the largest gRPC message; send fewer or shorter inputs")
        if reason == "deadline_unmeetable":  # refused at once, not retried: the queue ahead outlasts the deadline
            return IvyError(Problem.DEADLINE_UNMEETABLE, "the request cannot finish within its deadline behind the "
                            "work queued ahead of it in its priority lane; retry later or with a longer deadline",
                            retry_after_s=retry_after_s)
        return IvyError(Problem.REPLICA_BUSY, "the model replicas are at capacity; retry later")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return IvyError(Problem.DEADLINE_EXCEEDED, "the request did not finish within its deadline")
    if code == grpc.StatusCode.UNAVAILABLE:
        return IvyError(Problem.UNAVAILABLE, "no model replica is available; retry later")
    if code == grpc.StatusCode.CANCELLED:
        # Ivy's own cancellations surface as asyncio.CancelledError, never as a status: a CANCELLED status
        # means the replica dropped the call (a server stopping cancels what it still holds).
        return IvyError(Problem.UNAVAILABLE, f"model replica {replica} dropped the call; retry later")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return IvyError(Problem.INVALID_PARAMETER, f"the model replica rejected the input: {details[:200]}")
    return IvyError(Problem.BACKEND_ERROR, f"model replica {replica} failed: {code.name}")
