"""Where the framed EmbedStream listens (tulip.framed speaks it): the port of one TulipServer, bound on the host forms
the gRPC port takes, and its sessions, closed with it."""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING

from tulip.framed import FramedSession

if TYPE_CHECKING:
    from tulip.server import TulipServer

__all__ = ["FramedListener"]


class FramedListener:
    """The framed port of one TulipServer: start() binds it, close() stops listening and ends every connection
    (after the drain has answered what they had open)."""

    def __init__(self, server: TulipServer) -> None:
        self.server = server
        self.port = 0
        self._listener: asyncio.base_events.Server | None = None
        self._sessions: set[FramedSession] = set()

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port, host as the gRPC port takes it: "[::]" (or "::", "") is every interface of both
        families, as gRPC's dual-stack socket is (asyncio's "::" alone would refuse IPv4 clients). An ephemeral
        port (0) there is one dual-stack socket: asyncio would bind each family its own port, and Info names one."""
        max_frame = self.server.config.max_message_bytes
        host = host.strip("[]")
        host = None if host in ("", "::") else host
        sock = _dual_stack_ephemeral() if host is None and port == 0 else None
        where = {"sock": sock} if sock is not None else {"host": host, "port": port}
        self._listener = await asyncio.get_running_loop().create_server(
            lambda: FramedSession(self.server, max_frame, self._sessions), **where)
        self.port = self._listener.sockets[0].getsockname()[1]
        return self.port

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for session in list(self._sessions):
            if session.transport is not None:
                session.transport.close()


def _dual_stack_ephemeral() -> socket.socket | None:
    """One IPv6 socket bound to an ephemeral port that takes IPv4 too; None where IPv6 is off."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("::", 0))
        return sock
    except OSError:
        sock.close()
        return None
