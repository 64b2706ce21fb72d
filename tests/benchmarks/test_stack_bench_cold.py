"""Cold hits apart: the client reads X-Cold-Start, and a record keeps the steady state's percentiles and
the cold hits' count and latencies beside the percentiles over every request."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.stack.client import Sample
from ivy.http_connection import Connection
from benchmarks.stack.report import summarize


def test_a_record_reports_the_steady_state_and_the_cold_hits_apart() -> None:
    warm = [Sample(i * 0.01, 0.002, 1, 10, True) for i in range(99)]
    cold = [Sample(1.0, 0.050, 1, 10, True, cold=True)]
    record = summarize("concurrency", 1, warm + cold)
    assert record["cold_requests"] == 1 and record["cold_max_ms"] == pytest.approx(50.0)
    assert record["steady_p99_ms"] == pytest.approx(2.0) and record["steady_p50_ms"] == pytest.approx(2.0)
    assert record["p99_ms"] > 2.4  # the percentiles over every request keep the cold hit
    assert "cold_p50_ms" not in summarize("concurrency", 1, warm)


@pytest.fixture
def server():
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(200)
            if self.path == "/cold":
                self.send_header("x-cold-start", "1")
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()


def test_the_connection_reads_x_cold_start(server) -> None:
    conn = Connection(server)
    assert conn.post("/cold", b"{}").cold is True
    assert conn.post("/warm", b"{}").cold is False
