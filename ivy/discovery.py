"""Tulip replicas from DNS (RELIABILITY 37): a headless Service's name, resolved again every health interval.

`--replicas-dns NAME:PORT` (IVY_REPLICAS_DNS; it replaces --replicas), or an entry `dns:///NAME:PORT` in
--replicas, stands for every address NAME resolves to (A and AAAA records: a headless Service has one per
ready pod), each on PORT. The pool resolves the names at start and before each health round, with
socket.getaddrinfo on a thread (never on the event loop): an address that appears becomes a replica
(probed in the same round, routed to once it answers SERVING); one that disappears leaves the routing
list at once, its calls in flight finish, then its channel closes. A failed or empty resolution (NXDOMAIN
while no pod is ready, a DNS outage) keeps the current set: replicas that are really gone fail their probes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from collections.abc import Callable, Iterable

log = logging.getLogger("ivy.replicas")

PREFIX = "dns:"
RESOLVE_TIMEOUT_S = 5.0  # a resolver that hangs must not stall the health rounds for longer


def is_dns(entry: str) -> bool:
    return entry.startswith(PREFIX)


def parse(entry: str) -> tuple[str, int]:
    """`dns:///NAME:PORT` (or NAME:PORT) -> (NAME, PORT); ValueError naming the expected form."""
    rest = entry[len(PREFIX):].lstrip("/") if is_dns(entry) else entry
    host, sep, port = rest.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"replica DNS name {entry!r}: expected NAME:PORT (dns:///NAME:PORT in --replicas)")
    return host, int(port)


def address_of(sockaddr: tuple) -> str:
    """host:port for gRPC from a getaddrinfo socket address (IPv6 in brackets)."""
    host, port = sockaddr[0], sockaddr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Discovery:
    """The DNS names among the replica entries and how to resolve them."""

    def __init__(self, entries: Iterable[str], resolver: Callable = socket.getaddrinfo) -> None:
        self.names = [parse(e) for e in entries]
        self.resolver = resolver

    def __bool__(self) -> bool:
        return bool(self.names)

    async def addresses(self) -> list[str] | None:
        """Every address the names resolve to, sorted; None when a name failed to resolve (or to nothing)."""
        loop = asyncio.get_running_loop()
        found: set[str] = set()
        for host, port in self.names:
            lookup = functools.partial(self.resolver, host, port, type=socket.SOCK_STREAM)
            try:  # asyncio.timeout, not wait_for: 3.11's wait_for loses a cancel that lands as the lookup finishes
                async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                    infos = await loop.run_in_executor(None, lookup)
            except (OSError, TimeoutError) as exc:  # socket.gaierror is an OSError
                log.warning("resolving %s:%d failed (%s); keeping the current replicas", host, port,
                            type(exc).__name__)
                return None
            addresses = {address_of(info[4]) for info in infos}
            if not addresses:
                log.warning("%s:%d resolved to no address; keeping the current replicas", host, port)
                return None
            found |= addresses
        return sorted(found)
