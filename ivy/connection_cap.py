"""Who gets in over a worker's connection cap (--max-connections), and who is closed to make room (RELIABILITY 48, 49).

A new connection over the cap first closes the connection idle longest (no request in progress: kept alive,
silent, or still sending its headers), as nginx reuses its idle keep-alive connections, so idle sockets never lock
out new clients. With every connection busy nothing can make room, yet the kubelet's liveness probe must still be
answered: a 503 for it restarts a gateway that is only busy, and with it every request in flight. So a few
connections over the cap (--probe-connections, 8 by default) are a reserve for health probes:

- a newcomer that finds every connection busy enters the reserve; its request line and headers must arrive within
  PROBE_HEADER_TIMEOUT_S of its connect (a kubelet sends them at once), else it is answered 503 and closed;
- its request is served only when it is a GET of a probe path (PROBE_PATHS: the manifests' liveness and
  readiness probes, deploy/k8s/ivy.yaml, and Prometheus's scrape), and the connection closes after the answer
  (Connection: close), giving its place back; any other request is answered 503 with Retry-After (the cap's
  answer) and closed, its body read first (as much as the drain of a body answered early reads, within
  PROBE_HEADER_TIMEOUT_S): a socket closed with bytes unread is reset, and a client still sending its body saw
  the reset, not the 503;
- with the reserve full, a newcomer closes (503) the reserve connection that has waited longest without a request,
  else (every reserve connection's probe being answered) it is answered 503 at once, as before the reserve.

So a worker holds at most cap + reserve connections (and those it has just closed), whatever a flood sends, and
a flood of silent or trickling fake probes cannot hold the reserve against a real one: each newcomer takes the
place of the connection waiting longest, and a real probe's request arrives with its connection (a loopback or
node-local round trip), so it is lost only to more than `reserve` newcomers within that round trip.

Not chosen: a second port for probes, outside the cap (as some servers keep an admin port). Every uvicorn worker
would need a second listening socket shared with the others, and every deployment its probes moved; the reserve
keeps the one port every manifest already probes, and costs --probe-connections descriptors (taken off the
automatic cap, so the open-file limit still holds).
"""

from __future__ import annotations

import asyncio

from ivy import metrics
from ivy.errors import IvyError, Problem

EVICT_AFTER_S = 2.0  # idle at least this long before a connection may be closed to make room: a connection just
# answered may already be carrying a proxy's next request (closed now, that request would get a 502)
PROBE_HEADER_TIMEOUT_S = 1.0  # a reserve connection's request line and headers, from its connect (at most the
# header timeout): a kubelet sends them at once; a fake probe holds a place no longer than this
PROBE_FLUSH_S = 5.0  # a reserve connection's answer must be read whole within this of its end, else it is aborted
PROBE_PATHS = frozenset({"/health", "/ready", "/metrics"})  # /metrics: a scrape during overload is when it counts
PROBE_METHODS = frozenset({"GET"})  # the routes are GET only (a HEAD would get 405)

OPEN, PROBE, FULL = "open", "probe", "full"  # admit()'s answers

_IDLE: dict = {}  # this process's connections with no request in progress -> since when (loop time), oldest first
_RESERVE: dict = {}  # connections admitted over the cap for a probe, oldest first (an ordered set: values None)


def admit(conn, cap: int, reserve: int) -> str:
    """Where a new connection (already among conn.connections) goes: OPEN (under the cap, or the connection idle
    longest closed to make room), PROBE (into the reserve: only a probe is served), FULL (answered 503 at once)."""
    if not cap or len(conn.connections) - len(_RESERVE) <= cap or _evict_idle(conn):
        return OPEN
    if reserve and (len(_RESERVE) < reserve or _evict_waiting_probe(cap)):
        _RESERVE[conn] = None
        return PROBE
    return FULL


def in_reserve(conn) -> bool:
    return conn in _RESERVE


def idle(conn) -> None:
    """conn has no request in progress from now (kept alive after an answer, or new): the first to be evicted
    once idle longest. A reserve connection never is: it closes after its one answer."""
    if conn not in _RESERVE:
        _IDLE[conn] = conn.loop.time()


def busy(conn) -> None:
    _IDLE.pop(conn, None)


def forget(conn) -> None:
    """conn is closed."""
    _IDLE.pop(conn, None)
    _RESERVE.pop(conn, None)


def _evict_idle(newcomer) -> bool:
    """Make room for a connection over the cap by closing the one idle longest (idle EVICT_AFTER_S at least,
    nothing of an answer left unsent), without an answer, as its keep-alive timeout would have; False when none
    is (every connection busy, or idle only just)."""
    cutoff = newcomer.loop.time() - EVICT_AFTER_S
    for victim, since in _IDLE.items():  # oldest first: stops at the first too recent to evict
        if since > cutoff:
            return False
        if victim is not newcomer and not victim.transport.is_closing() \
                and not victim.transport.get_write_buffer_size():  # (a close would wait for a slow reader)
            del _IDLE[victim]
            metrics.CONNECTIONS_REFUSED.labels("idle_evicted").inc()
            victim._cancel_header_timer()
            victim.transport.close()
            return True
    return False


def _evict_waiting_probe(cap: int) -> bool:
    """The reserve is full: close (503) the reserve connection that has waited longest without its request;
    False when every one's request is being answered."""
    for victim in _RESERVE:
        if victim.cycle is None and not victim.transport.is_closing():
            del _RESERVE[victim]
            victim._refuse(Problem.TOO_MANY_CONNECTIONS, over_the_cap(cap), "probe_evicted")
            return True
    return False


def over_the_cap(cap: int) -> str:
    """The 503's message: the same whether refused at once or in the reserve."""
    return f"the server is at its limit of {cap} open connections, every one busy; retry later"


class ProbesOnly:
    """The ASGI app of a reserve connection: a probe (GET of PROBE_PATHS) goes to the app and the
    connection closes after its answer; anything else is answered 503 with Retry-After and closed, its body read
    first (bounded) so that the client, which sends its whole body before it reads, gets the 503 and not a reset."""

    def __init__(self, app, cap: int, max_body_read: int) -> None:
        self.app, self.cap, self.max_body_read = app, cap, max_body_read

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] in PROBE_METHODS and scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, _closing(send))
            return
        metrics.CONNECTIONS_REFUSED.labels("probe_only").inc()
        if scope["type"] == "http":
            try:  # (asyncio.timeout, not wait_for: 3.11's wait_for can lose a cancel that lands as it finishes)
                async with asyncio.timeout(PROBE_HEADER_TIMEOUT_S):
                    await _discard_body(receive, self.max_body_read)
            except TimeoutError:  # a trickling body: answered now (the client may see the close as a reset)
                pass
        response = IvyError(Problem.TOO_MANY_CONNECTIONS, over_the_cap(self.cap)).to_response()
        response.headers["connection"] = "close"
        await response(scope, receive, send)


async def _discard_body(receive, most: int) -> None:
    """Read a request's body to its end or to `most` bytes, whichever comes first."""
    read = 0
    while read <= most:
        message = await receive()
        read += len(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body"):
            return


def _closing(send):
    """`send` with Connection: close on the answer's head: uvicorn closes the connection once it is sent."""

    async def send_then_close(message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
        await send(message)

    return send_then_close
