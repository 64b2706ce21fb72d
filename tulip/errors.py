"""Tulip's typed errors. Each class names the gRPC status it maps to: this file is the one table.

The names are grpc.StatusCode member names, so this module imports no grpc and the queue and request
parsing stay pure logic. Messages name the field and the limit, and never contain token ids. `reason`
travels as the trailing metadata key "tulip-reason", so a client can tell apart errors that share a
status (RESOURCE_EXHAUSTED: queue_full -> retry elsewhere / 429; response_too_large -> 413). An error that
knows when a retry could succeed (deadline_unmeetable: the estimated wait ahead in the lane) sends it as
"tulip-retry-after-s" (seconds, decimal) beside the reason.
"""

from __future__ import annotations


class TulipError(Exception):
    status = "INTERNAL"
    reason = "internal"

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s  # when to retry, where known; "tulip-retry-after-s" on the wire


class InvalidRequest(TulipError):
    """The request breaks the wire contract or a model limit (bad lengths, spans, dimensions...)."""

    status = "INVALID_ARGUMENT"
    reason = "invalid_argument"


class QueueFull(TulipError):
    """Admitting the request would put more tokens in the queue than max_queue_tokens."""

    status = "RESOURCE_EXHAUSTED"
    reason = "queue_full"


class DeadlineUnmeetable(TulipError):
    """Admission (tulip/lanes.py): a lower bound on the device time of the tokens queued ahead of the request
    in its lane plus its own (tulip.pacing.Pace) already exceeds its deadline; refused at once, not after
    waiting. `retry_after_s`: that bound for the work ahead of it, None when its own work alone exceeds it."""

    status = "RESOURCE_EXHAUSTED"
    reason = "deadline_unmeetable"


class ResponseTooLarge(TulipError):
    """The response would exceed the message size limit; caught before any work is done."""

    status = "RESOURCE_EXHAUSTED"
    reason = "response_too_large"


class FrameTooLarge(TulipError):
    """A framed-stream frame longer than the message limit (tulip/framed.py): answered once on id 0, then
    the connection is closed."""

    status = "RESOURCE_EXHAUSTED"
    reason = "message_too_large"


class TooManyConnections(TulipError):
    """A framed-stream connection over framed_max_connections (tulip/framed.py): answered once on id 0, then
    closed. Ivy then keeps that replica on its gRPC stream."""

    status = "RESOURCE_EXHAUSTED"
    reason = "too_many_connections"


class AnswersUnread(TulipError):
    """A gRPC EmbedStream's unsent answers stayed above WRITE_HIGH_BYTES for STALL_S (tulip/stream.py): its call
    is ended. RESOURCE_EXHAUSTED rather than CANCELLED: the client did not go away, it exhausted what Tulip holds
    for one stream (as a too-large message does), and what it was owed and not sent is lost: retry it, reading
    the answers."""

    status = "RESOURCE_EXHAUSTED"
    reason = "answers_unread"


class BadFrame(TulipError):
    """Framed-stream bytes that are not a StreamRequest (tulip/framed.py): answered once on id 0, then the
    connection is closed."""

    status = "INVALID_ARGUMENT"
    reason = "bad_frame"


class StreamProtocolError(TulipError):
    """A stream's client broke the stream's own contract (tulip/stream.py): a request id sent again while that id is
    still in flight, or a message that could not be decoded and whose id could not be read. No answer on a
    request's id can say so without being taken for that request's answer, so, as HTTP/2 treats a reused stream
    id, the stream itself is ended: the gRPC EmbedStream with this status (its open requests cancelled), the framed
    port with an answer on id 0 before it closes the connection."""

    status = "INVALID_ARGUMENT"
    reason = "stream_protocol_error"


class DeadlineExpired(TulipError):
    """The request's deadline passed while it waited; its sequences never reached the engine."""

    status = "DEADLINE_EXCEEDED"
    reason = "deadline_exceeded"


class NotReady(TulipError):
    """The model is still loading or warming up."""

    status = "UNAVAILABLE"
    reason = "not_ready"


class ShuttingDown(TulipError):
    """The replica is draining after SIGTERM; the caller should retry on another replica."""

    status = "UNAVAILABLE"
    reason = "shutting_down"


class Stalled(TulipError):
    """The watchdog found the oldest batch in flight far overdue (a stuck device): health is NOT_SERVING
    and new work goes to another replica until that batch completes."""

    status = "UNAVAILABLE"
    reason = "stalled"


class QueueClosed(ShuttingDown):
    """Raised by the queue once closed; same meaning as ShuttingDown."""


class EngineFailed(TulipError):
    """The engine raised on this request's batch; other batches and the replica are unaffected."""

    status = "INTERNAL"
    reason = "engine_failed"


class DeviceLost(TulipError):
    """A batch failed and the device no longer runs work (a CUDA error that poisons the context: an illegal
    address, a device-side assert, an uncorrectable ECC error, a GPU gone from the bus): every later batch would
    fail too. The replica refuses new work, answers what it holds with this, and exits (tulip.server,
    RELIABILITY 62); the caller retries on another replica."""

    status = "UNAVAILABLE"
    reason = "device_lost"


class EngineOverloaded(TulipError):
    """The engine ran out of memory (pinned pool at its cap past its timeout, or device OOM) on this
    request's batch; the replica stays up and the caller may retry."""

    status = "RESOURCE_EXHAUSTED"
    reason = "engine_overloaded"


def error_metadata(exc: TulipError) -> tuple[tuple[str, str], ...]:
    """The unary call's trailing metadata for `exc`: its reason, and its retry estimate when it has one."""
    if exc.retry_after_s is None:
        return (("tulip-reason", exc.reason),)
    return (("tulip-reason", exc.reason), ("tulip-retry-after-s", f"{exc.retry_after_s:.3f}"))


# Engine exceptions recognised by class name, so Tulip need not import torch or rose.lazy to catch them.
OVERLOAD_EXCEPTION_NAMES = frozenset({"PinnedPoolExhausted", "OutOfMemoryError"})


def engine_error(exc: BaseException) -> TulipError:
    """The caller-facing error for an exception raised by engine.step() or LazyTensor.wait()."""
    if type(exc).__name__ in OVERLOAD_EXCEPTION_NAMES:
        return EngineOverloaded(f"the engine ran out of memory on this request's batch ({type(exc).__name__}); "
                                "retry, or send fewer tokens per request")
    return EngineFailed(f"engine failed on this request's batch: {type(exc).__name__}")
