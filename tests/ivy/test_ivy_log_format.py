"""Logs in JSON for a log pipeline (`IVY_LOG_FORMAT=json`, `TULIP_LOG_FORMAT=json`; rose/log_format.py): every line
one object with time, level, logger, message, service, pid, the request id being served and any `extra=` fields;
uvicorn's own lines in the same format; and the workers of `ivy serve --workers N` logging at all (a worker is a
new interpreter: before, its info lines, e.g. a replica turning SERVING, never reached stderr)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import urllib.request

import pytest

from fake_tulip import FakeTulip
from ivy.config import IvyConfig
from ivy_testkit import ivy_server
from rose.log_format import JsonFormatter, setup


def _record(message: str, *args, exc_info=None, **extra) -> logging.LogRecord:
    record = logging.getLogger("ivy.test").makeRecord("ivy.test", logging.WARNING, __file__, 1, message, args,
                                                       exc_info, extra=extra)
    return record


def test_a_json_line_has_the_fields_a_pipeline_indexes() -> None:
    line = json.loads(JsonFormatter("ivy", lambda: {"request_id": "r-1"}).format(
        _record("replica %s: %s", "10.0.0.7:50051", "SERVING", chunk=3)))
    assert line["message"] == "replica 10.0.0.7:50051: SERVING" and line["level"] == "WARNING"
    assert line["logger"] == "ivy.test" and line["service"] == "ivy" and line["pid"] == os.getpid()
    assert line["request_id"] == "r-1" and line["chunk"] == 3
    assert line["time"].endswith("Z") and len(line["time"]) == len("2026-12-05T01:02:03.456Z")


def test_no_request_id_outside_a_request_and_the_traceback_kept() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = _record("failed", exc_info=sys.exc_info())
    line = json.loads(JsonFormatter("tulip", lambda: {"request_id": ""}).format(record))
    assert "request_id" not in line and "ValueError: boom" in line["exception"]


def test_setup_replaces_the_handlers_and_routes_uvicorn_through_them(capsys) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        uvicorn_error = logging.getLogger("uvicorn.error")
        uvicorn_error.addHandler(logging.StreamHandler(sys.stdout))
        uvicorn_error.setLevel(logging.WARNING)  # as an in-process uvicorn of an earlier test may have left it
        setup("info", "json", "ivy")
        plain = [h for h in root.handlers if type(h) is logging.StreamHandler]
        assert len(plain) == 1 and isinstance(plain[0].formatter, JsonFormatter)
        assert not logging.getLogger("uvicorn.error").handlers
        logging.getLogger("uvicorn.error").info("Started server process [%d]", 1)
        assert json.loads(capsys.readouterr().err.strip().splitlines()[-1])["logger"] == "uvicorn.error"
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.captureWarnings(False)


def test_an_unknown_format_is_refused_naming_the_flag() -> None:
    with pytest.raises(SystemExit, match="--log-format"):
        IvyConfig(log_format="xml")
    out = subprocess.run([sys.executable, "-m", "tulip", "serve", "--log-format", "xml"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "log_format" in out.stderr


def _serve_with_workers(**env) -> tuple[int, list[dict]]:
    """`ivy serve --workers 2` in JSON, 3 requests to /health: the parent's pid and every record it wrote."""
    with tempfile.TemporaryFile("w+") as err:
        with FakeTulip() as fake:
            with ivy_server(IVY_REPLICAS=fake.address, IVY_WORKERS="2", IVY_LOG_FORMAT="json",
                            IVY_LOG_LEVEL="info", _stderr=err, **env) as (port, proc):
                for _ in range(3):
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
                        assert r.status == 200
                parent = proc.pid
        err.seek(0)
        lines = [line for line in err.read().splitlines() if line.strip()]
    return parent, [json.loads(line) for line in lines]  # every line is one JSON object


def test_ivy_serve_with_workers_logs_every_line_as_json() -> None:
    parent, records = _serve_with_workers()
    assert all(r["service"] == "ivy" for r in records)
    workers = {r["pid"] for r in records if r["logger"].startswith("ivy") and r["level"] == "INFO"} - {parent}
    assert len(workers) == 2, records  # each worker's own info lines (its replica turning SERVING)
    assert any(r["logger"] == "uvicorn.error" for r in records)
    # no line a request: a worker's logging set-up once re-enabled uvicorn's access log, which costs every request
    assert not any(r["logger"] == "uvicorn.access" for r in records), records


def test_the_access_log_is_there_when_asked_for() -> None:
    _, records = _serve_with_workers(IVY_ACCESS_LOG="true")
    access = [r for r in records if r["logger"] == "uvicorn.access"]
    health = [r for r in access if '"GET /health HTTP/1.1" 200' in r["message"]]
    assert len(health) >= 3, records  # ours, and the test server's own readiness probes


def test_unusual_records_still_make_one_strict_json_line() -> None:
    """Extras JSON cannot hold (tuple keys, NaN) become their repr, the line kept; an extra named like a field
    of the line does not replace it; uvicorn's ANSI `color_message` is left out; stack_info kept as `stack`."""
    formatter = JsonFormatter("ivy")
    record = _record("shape %s", "ok", shape={(1, 2): 3}, ratio=float("nan"), level="fake", color_message="\x1b[1m")
    record.stack_info = "Stack (most recent call last):\n  here"
    text = formatter.format(record)
    line = json.loads(text)  # strict: json.loads accepts NaN, so check the text too
    assert "NaN" not in text and line["ratio"] == "nan" and line["shape"] == "{(1, 2): 3}"
    assert line["level"] == "WARNING" and "color_message" not in line and line["stack"].endswith("here")


def test_setup_keeps_a_test_runners_capture_handler(caplog) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        setup("info", "text", "ivy-index")  # as `ivy index` run in-process by a test
        logging.getLogger("ivy.index").warning("after setup")
        assert "after setup" in caplog.text
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.captureWarnings(False)
