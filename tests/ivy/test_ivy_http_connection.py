"""ivy.http_connection, the stdlib keep-alive connection of ivy index and the benchmarks: reuse, one reconnect
after an idle close, clear errors, the answer's headers."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from ivy.http_connection import Connection, HTTPError


class TinyServer:
    """Answers every request with its own connection number; closes a connection after `per_conn` answers."""

    def __init__(self, per_conn: int) -> None:
        self.per_conn = per_conn
        self.connections = 0
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn, self.connections), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        buf, answered = b"", 0
        with conn:
            while answered < self.per_conn:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    buf += conn.recv(65536)
                self.requests.append(head.split(b"\r\n")[0] + b" " + buf[:length])
                buf = buf[length:]
                body = str(number).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
                answered += 1


@pytest.fixture
def server() -> Iterator[TinyServer]:
    s = TinyServer(per_conn=3)
    yield s
    s.sock.close()


def test_keep_alive_reuses_one_connection_and_sends_the_body(server: TinyServer) -> None:
    conn = Connection(f"http://127.0.0.1:{server.port}/prefix/", {"x-test": "1"})
    answers = [conn.post("/v1/embeddings", b'{"input":"a"}').text for _ in range(3)]
    assert answers == ["1", "1", "1"] and server.connections == 1
    assert server.requests[0] == b'POST /prefix/v1/embeddings HTTP/1.1 {"input":"a"}'
    answer = conn.get("/health")
    assert answer.headers == {"content-length": "1"} and not answer.cold
    conn.close()


def test_a_connection_closed_by_the_server_is_reopened_once(server: TinyServer) -> None:
    conn = Connection(f"http://127.0.0.1:{server.port}")
    answers = [conn.get("/health").text for _ in range(7)]
    assert answers == ["1", "1", "1", "2", "2", "2", "3"]
    conn.close()


def test_refused_and_malformed_urls_raise_http_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connecting is refused
        with pytest.raises(HTTPError, match="ConnectionRefused"):
            Connection(f"http://127.0.0.1:{port}").get("/health")
    with pytest.raises(HTTPError, match="not an http"):
        Connection("grpc://127.0.0.1:1")
