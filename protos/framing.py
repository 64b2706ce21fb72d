"""The framed EmbedStream's wire format (tulip/framed.py serves it, ivy/framed.py speaks it): each message is
its protobuf bytes behind a 4-byte little-endian length."""

from __future__ import annotations

import socket
import struct

LENGTH = struct.Struct("<I")
# A Tulip's framed port by default (TULIP_FRAMED_PORT=-1, and `ivy up`): its gRPC port + this.
PORT_OFFSET = 200


def frame(message) -> bytes:
    """One message, framed."""
    out = message.SerializeToString()
    return LENGTH.pack(len(out)) + out


class FrameBuffer:
    """Bytes as they arrive in, the payloads of complete frames out. A length over `max_bytes` is never
    waited for: `oversize` names it and nothing past it is read."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.oversize = 0
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer
        buffer += data
        start, payloads = 0, []
        while not self.oversize and len(buffer) - start >= LENGTH.size:
            (size,) = LENGTH.unpack_from(buffer, start)
            if size > self.max_bytes:
                self.oversize = size
                break
            end = start + LENGTH.size + size
            if len(buffer) < end:
                break
            payloads.append(bytes(buffer[start + LENGTH.size:end]))
            start = end
        del buffer[:start]
        return payloads

    @property
    def partial(self) -> bool:
        """Bytes of a frame not yet complete are held."""
        return bool(self._buffer)


def keep_alive(transport) -> None:
    """Both ends of a framed connection: TCP_NODELAY (each frame goes out at once) and keepalive probes, so a
    peer lost to a partition or a dead node is noticed in ~1 min (Tulip frees its session and its place under
    the connection cap; Ivy fails its requests over)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
