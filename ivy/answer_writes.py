"""An answer's status line and headers written together with its body: one send, not two.

uvicorn's httptools protocol writes an answer's head (status line and headers) as soon as the app sends
`http.response.start`, and the body at `http.response.body`: two `send` system calls and two TCP segments for
every answer, each of which the client wakes for (on loopback each send also runs the receiver's side of TCP).
`HeadHeld` is the transport uvicorn gets: the first write after a request's headers were read (the head of
its answer) is held, and the next write (the body, in the same loop turn for every non-streaming answer) goes
out joined to it. A head is never held longer than its answer lasts: it is written at the answer's end
(`flush`, from the protocol's on_response_complete: a HEAD answer or one without a body), before a close,
and with a streaming answer's first chunk. `100 Continue` is written at once (the client waits for it before
sending its body). Everything else passes straight to the real transport.
"""

from __future__ import annotations

CONTINUE = b"HTTP/1.1 100"
JOIN_UNDER = 1 << 16  # a larger body goes out by writelines (one writev) instead of being copied into the head


class HeadHeld:
    __slots__ = ("_transport", "_head", "hold_next")

    def __init__(self, transport) -> None:
        self._transport = transport
        self._head: bytes | None = None
        self.hold_next = False  # set by the protocol when a request's headers are complete

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if len(data) < JOIN_UNDER:
                self._transport.write(head + data)
            else:
                self._transport.writelines((head, data))
        elif self.hold_next and not data.startswith(CONTINUE):
            self.hold_next = False
            self._head = bytes(data)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        """The answer ended (or the connection closes): its head goes out if nothing followed it."""
        self.hold_next = False
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head)

    def writelines(self, lines) -> None:
        for data in lines:
            self.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._head = None
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + (len(self._head) if self._head is not None else 0)

    def __getattr__(self, name: str):  # pause_reading, get_extra_info, set_protocol, ...: the real transport's
        return getattr(self._transport, name)
