"""Per-connection limits uvicorn lacks: header size, header read timeout, idle new connections, a cap, a send
timeout.

uvicorn's httptools protocol has no header size limit, and httptools joins the pieces of one header with
`bytes +=` (quadratic): one unauthenticated 150 MB header held the event loop ~20 s, long enough for the
replicas' health probes to fail. A connection that sends nothing, or trickles its headers, was never
closed (uvicorn arms its keep-alive timer only after an answer), so idle sockets could take every file
descriptor. `ivy serve` runs these subclasses of uvicorn's protocols instead (RELIABILITY 26, 27):

- request line and headers over --max-header-bytes: 431 and the connection closed (h11, the fallback when
  httptools is missing, bounds its own buffer at the same size and answers 400);
- headers not complete --header-read-timeout-s after their first byte: 408 and closed;
- a new connection that sends nothing: closed after the keep-alive timeout, like an idle kept-alive one;
- over --max-connections open in this process: the connection idle longest (no request in progress) is closed
  to make room; when every one has a request in progress the new one enters a small reserve where only a health
  probe is served, anything else answered 503 with Retry-After (ivy/connection_cap.py: RELIABILITY 27, 48, 49);
- an answer the client does not read: while the transport's send buffer is over its high-water mark (from
  asyncio's pause_writing to resume_writing), and from the end of an answer some of which is still unsent
  (under the mark, a kept-alive or closing connection waited for it for ever, so unread /metrics or
  /openapi.json answers could hold the whole cap), each --send-timeout-s must see some of it sent; a client that
  read nothing in that time is aborted, which frees the unsent bytes (a slow reader is only watched longer); a
  probe-reserve connection's answer must be read whole within PROBE_FLUSH_S of its end. 30 stalled readers of
  2048-input answers held +382 MiB in one worker, indefinitely, before (RELIABILITY 40).

Bytes are counted between requests (no request of this connection in progress), where every byte received
is part of the next request's line or headers, and behind a request in progress whose body is whole (the next,
pipelined request's), so the count is exact but for the one read that ends a body; the hot path pays a few
attribute checks per read. An answer given before its body was read (a bad header, a body over the cap) leaves
the rest of that body to come: uvicorn discards it, and it is not the next request's headers. It is drained
up to the body cap and within the body read timeout (--body-read-timeout-s: a client may take that long to send a
body that is read, and one answered early must not be reset sooner), else the connection is closed without a
second answer (counted as headers, it drew an unasked-for 431 that the client's next request read: RELIABILITY 44).
The limits are set per process by `configure()` (from create_app, which every worker runs) because uvicorn
hands its protocols only its own config.
"""

from __future__ import annotations

import asyncio
import http
import logging
import resource
from dataclasses import dataclass

import h11
import orjson
from uvicorn.protocols.http.h11_impl import H11Protocol

from ivy import connection_cap, metrics
from ivy.config import IvyConfig
from ivy.connection_cap import PROBE_FLUSH_S, PROBE_HEADER_TIMEOUT_S
from ivy.errors import PROBLEMS, RETRY_AFTER_S, Problem

log = logging.getLogger("ivy")

FD_RESERVE = 256  # descriptors kept for gRPC channels, the model's files, logs, the listening socket


@dataclass(frozen=True)
class ConnectionLimits:
    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = 10.0
    max_connections: int = 0  # 0: no cap
    send_timeout_s: float = 30.0  # 0: never
    max_drain_bytes: int = 2 * 1024 * 1024  # the rest of a body answered early, read and discarded
    drain_timeout_s: float = 10.0  # ... within this (the body read timeout)
    probe_connections: int = 8  # over the cap, kept for health probes (ivy/connection_cap.py)

    @classmethod
    def from_config(cls, config: IvyConfig) -> ConnectionLimits:
        cap = config.max_connections
        if cap == 0:  # auto: what this process's open-file limit leaves room for
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            cap = 0 if soft == resource.RLIM_INFINITY else max(64, soft - FD_RESERVE - config.probe_connections)
        return cls(config.max_header_bytes, config.header_read_timeout_s, cap, config.send_timeout_s,
                   config.payload_limit_bytes, config.body_read_timeout_s, config.probe_connections)


LIMITS = ConnectionLimits()


def configure(config: IvyConfig) -> None:
    global LIMITS
    LIMITS = ConnectionLimits.from_config(config)


def protocol_class() -> str:
    """uvicorn's `http` option: the httptools protocol with the limits, or h11's when httptools is missing."""
    return f"ivy.connections:{'HttpToolsLimits' if HttpToolsProtocol is not None else 'H11Limits'}"


def _raw_response(problem: Problem, message: str) -> bytes:
    """A whole HTTP/1.1 answer with the OpenAI error body, written straight to the transport."""
    status, kind = PROBLEMS[problem]
    body = orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": problem.value}})
    retry = f"retry-after: {RETRY_AFTER_S[problem]}\r\n" if problem in RETRY_AFTER_S else ""
    head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n{retry}connection: close\r\n\r\n")
    return head.encode() + body


def _expects_100(cycle) -> bool:
    return cycle is not None and (b"expect", b"100-continue") in (
        (name.lower(), value.lower()) for name, value in cycle.scope.get("headers", ()))


class _Limits:
    """Mixed in ahead of uvicorn's H11Protocol or HttpToolsProtocol, whose attributes it uses: connections,
    cycle (a new one per request whose headers are complete), transport, loop and the keep-alive timer."""

    _header_bytes = 0
    _drained = 0  # bytes of an answered request's body that arrived after its answer
    _header_timer: asyncio.TimerHandle | None = None
    _send_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        cap = LIMITS.max_connections
        place = connection_cap.admit(self, cap, LIMITS.probe_connections)
        if place == connection_cap.FULL:
            self._refuse(Problem.TOO_MANY_CONNECTIONS, connection_cap.over_the_cap(cap), "connection_cap")
        elif place == connection_cap.PROBE:  # only a probe is served, and its request must come at once
            self.app = connection_cap.ProbesOnly(self.app, cap, LIMITS.max_drain_bytes)
            self._header_timer = self.loop.call_later(min(PROBE_HEADER_TIMEOUT_S, LIMITS.header_timeout_s),
                                                      self._probe_timeout)
        else:
            connection_cap.idle(self)
            # Closed after the keep-alive timeout unless a byte arrives (data_received cancels this timer).
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                self.timeout_keep_alive_handler)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        unsent = self.transport.get_write_buffer_size()
        if unsent and self._send_timer is None:  # an answer under the high-water mark the client does not read
            if connection_cap.in_reserve(self):  # (would hold its place as long as it stays connected: RELIABILITY
                self._send_timer = self.loop.call_later(PROBE_FLUSH_S, self._probe_unflushed)  # 40, 48, 49)
            elif LIMITS.send_timeout_s:
                self._watch_send(unsent)
        if self.transport.is_closing() or not (self.cycle is None or self.cycle.response_complete):
            return
        if not self._body_received() and _expects_100(self.cycle):
            # answered before its body came, the client waiting for a 100 (uvicorn sends one only when the app reads
            # the body): it sends no body (RFC 9110 10.1.1) and may send its next request, which would be read as
            # that body, unanswered: closed instead, so it sends that request on a new connection
            self.transport.close()
            return
        if self._body_received():
            connection_cap.idle(self)  # kept alive with no request in progress (none pipelined)
        elif self._header_timer is None:  # answered early, its body still to come: drained within the body's
            self._header_timer = self.loop.call_later(LIMITS.drain_timeout_s, self._header_timeout, self.cycle)
            # time from now (RELIABILITY 44), not kept for the keep-alive timeout if not a byte of it arrives

    def handle_websocket_upgrade(self, *args) -> None:
        """uvicorn hands the transport to a WebSocket protocol (Ivy serves none: it answers 403) and this one's
        connection_lost never runs: forgotten here, or each handshake stayed in the cap's books for good."""
        connection_cap.forget(self)
        self._cancel_header_timer()
        super().handle_websocket_upgrade(*args)

    def _probe_unflushed(self) -> None:
        self._send_timer = None
        if self.transport.get_write_buffer_size():
            self._drop_unread()

    def _drop_unread(self) -> None:
        """Close now, the unsent bytes discarded (close() would wait to flush them)."""
        metrics.CONNECTIONS_REFUSED.labels("send_timeout").inc()
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        between = cycle is None or cycle.response_complete  # these bytes begin or continue the next request
        draining = between and not self._body_received()  # ... or end the body of one answered early
        behind = not between and self._body_received()  # ... or, sent behind one in progress, begin the next
        super().data_received(data)
        if self.transport.is_closing():
            return
        if not between:
            if behind:
                self._count_behind(cycle, len(data))
            return
        if self.cycle is not cycle:  # its headers are complete: a new request has started
            self._header_bytes = self._drained = 0
            self._cancel_header_timer()
            connection_cap.busy(self)
            return
        if draining:
            self._drained += len(data)
            if self._drained > LIMITS.max_drain_bytes:
                metrics.CONNECTIONS_REFUSED.labels("drain_too_large").inc()
                self.transport.close()  # answered already: nothing more is written
                return
            if self._body_received():  # drained: kept alive and idle, as after any answer
                self._drained = 0
                self._cancel_header_timer()
                self._unset_keepalive_if_required()
                self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                    self.timeout_keep_alive_handler)
                connection_cap.idle(self)
                return
        else:
            self._header_bytes += len(data)
        if self._header_bytes > LIMITS.max_header_bytes:
            self._refuse(Problem.HEADERS_TOO_LARGE, "the request line and headers are larger than the limit of "
                         f"{LIMITS.max_header_bytes} bytes", "header_too_large")
        elif self._header_timer is None:  # the drain of a body answered early has the body's time (RELIABILITY 44)
            wait = LIMITS.drain_timeout_s if draining else LIMITS.header_timeout_s
            self._header_timer = self.loop.call_later(wait, self._header_timeout, cycle)

    def _count_behind(self, cycle, size: int) -> None:
        """Bytes that arrived while a request whose body is whole is in progress: the next (pipelined) request's
        line and headers, which httptools reads on until they are complete. Counted and timed as between
        requests (uncounted, 100 MiB of one header were read behind a slow request: +140 MiB, the loop held
        6.7 s); over the cap or the time, the connection is dropped, as no answer can be written in the middle
        of the one in progress. The chunk that ends a body and begins the next headers is not counted: at
        most one read's worth escapes the count."""
        if self.cycle is not cycle:  # its headers are complete: uvicorn queued it and stopped reading
            self._header_bytes = 0
            self._cancel_header_timer()
            return
        self._header_bytes += size
        if self._header_bytes > LIMITS.max_header_bytes:
            metrics.CONNECTIONS_REFUSED.labels("header_too_large").inc()
            self._cancel_header_timer()
            self.transport.abort()
        elif self._header_timer is None:
            self._header_timer = self.loop.call_later(LIMITS.header_timeout_s, self._header_timeout, cycle)

    def _body_received(self) -> bool:
        """The current request's body has arrived whole (or there is no request yet)."""
        raise NotImplementedError

    def connection_lost(self, exc: Exception | None) -> None:
        connection_cap.forget(self)
        self._cancel_header_timer()
        self._cancel_send_timer()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        """The send buffer is over its high-water mark: the client has not read what was sent."""
        super().pause_writing()
        if LIMITS.send_timeout_s and self._send_timer is None:
            self._watch_send(self.transport.get_write_buffer_size())

    def resume_writing(self) -> None:
        super().resume_writing()
        self._cancel_send_timer()

    def _watch_send(self, unsent: int) -> None:
        self._send_timer = self.loop.call_later(LIMITS.send_timeout_s, self._send_timeout, unsent)

    def _send_timeout(self, unsent_before: int) -> None:
        """A send timeout passed with the buffer still over its mark: dropped if nothing of it was sent since
        (the client read nothing), watched again if some was (a slow link still makes progress)."""
        self._send_timer = None  # (connection_lost cancels it; a transport closing after `Connection: close`
        unsent = self.transport.get_write_buffer_size()  # still holds its unsent bytes until they are read)
        if not unsent:  # all sent (an answer watched from its end never pauses writing, so never resumes)
            return
        if unsent < unsent_before:
            self._watch_send(unsent)
            return
        log.info("a client read nothing of its answer for %g s: connection dropped", LIMITS.send_timeout_s)
        self._drop_unread()

    def _cancel_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _header_timeout(self, cycle) -> None:
        self._header_timer = None
        if self.cycle is cycle and not self.transport.is_closing() and not self._body_received():
            metrics.CONNECTIONS_REFUSED.labels("drain_timeout").inc()  # the rest of a body answered early
            self.transport.close()
        elif self.cycle is cycle and not self.transport.is_closing():  # still no new request: headers incomplete
            if cycle is not None and not cycle.response_complete:  # trickled behind one in progress: no answer
                metrics.CONNECTIONS_REFUSED.labels("header_timeout").inc()  # can go in the middle of its own
                self.transport.abort()
                return
            self._refuse(Problem.HEADER_TIMEOUT, f"the request headers did not arrive within "
                         f"{LIMITS.header_timeout_s:g} s", "header_timeout")

    def _probe_timeout(self) -> None:
        """A reserve connection whose request has not begun in time: answered as the cap answers, and closed."""
        self._header_timer = None
        if self.cycle is None and not self.transport.is_closing():
            self._refuse(Problem.TOO_MANY_CONNECTIONS, connection_cap.over_the_cap(LIMITS.max_connections),
                         "probe_timeout")

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _refuse(self, problem: Problem, message: str, reason: str) -> None:
        metrics.CONNECTIONS_REFUSED.labels(reason).inc()
        self._cancel_header_timer()
        self._unset_keepalive_if_required()
        self.transport.write(_raw_response(problem, message))
        self.transport.close()


class H11Limits(_Limits, H11Protocol):
    def _body_received(self) -> bool:
        return self.conn.their_state is not h11.SEND_BODY


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # uvicorn without its [standard] extra
    HttpToolsProtocol = None
else:
    class HttpToolsLimits(_Limits, HttpToolsProtocol):
        _received = None  # the cycle whose request the parser has read to its end

        def on_message_complete(self) -> None:
            super().on_message_complete()  # (which ignores it once answered)
            self._received = self.cycle

        def _body_received(self) -> bool:
            return self.cycle is None or self._received is self.cycle
