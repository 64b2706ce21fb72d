"""`ivy index` defects found in review: TSV quotes, a changed folder or a same-size edit of a file on --resume,
duplicate ids, summary.json after --resume, a refused option, a server that is down, Retry-After, a .json array,
Ctrl-C. The job runs here against
a fake embedder (no server) or a small scripted /v1/embeddings server."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import ivy.index.cli as index_cli
from ivy.cli import main
from ivy.index.client import FatalError, HttpEmbedder
from ivy.index.sources import read_docs


class FakeEmbedder:
    """Rows of 4 values derived from each text; call `fail_at` (the probe is call 0) raises `error`."""

    model_name, card_dimensions = "fake", 4

    def __init__(self, fail_at: int | None = None, error: BaseException | None = None) -> None:
        self.calls, self.fail_at, self.error = 0, fail_at, error
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        with self._lock:
            call, self.calls = self.calls, self.calls + 1
        if call == self.fail_at:
            raise self.error or FatalError("the server went away")
        return np.array([[len(t), 1, 2, 3] for t in texts], np.float32), 2 * len(texts)

    def close(self) -> None:
        pass


def run(monkeypatch, embedder, *args) -> int:
    monkeypatch.setattr(index_cli, "make_embedder", lambda config: embedder)
    return main(["index", *map(str, args), "--url", "http://fake", "--progress", "off"])


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def output(folder: Path) -> tuple[list[str], list[dict]]:
    ids = [i for p in sorted(folder.glob("part-*.parquet")) for i in pq.read_table(p).column("id").to_pylist()]
    return ids, [json.loads(line) for line in (folder / "rejects.jsonl").read_text().splitlines()]


ONE_WINDOW_A_CALL = ("--sort-window", 2, "--batch-size", 100, "--concurrency", 1)


def test_tsv_quotes_are_text_and_every_line_is_one_record(tmp_path: Path) -> None:
    """A .tsv was read with CSV quoting: a text starting with `"` and no closing quote swallowed every following
    row into one record; a balanced pair was removed from the text."""
    (tmp_path / "a.tsv").write_text('id\ttext\n1\t"Hi, she said. Then left\n2\tsecond\n3\t"quoted" start\n'
                                    '4\t5" screen\n')
    docs = list(read_docs(tmp_path / "a.tsv", "csv", "id", "text"))
    assert [(d.id, d.text) for d in docs] == [("1", '"Hi, she said. Then left'), ("2", "second"),
                                             ("3", '"quoted" start'), ("4", '5" screen')]
    assert [d.id for d in read_docs(tmp_path / "a.tsv", "csv", "id", "text", start=2)] == ["3", "4"]


def test_resuming_a_folder_that_changed_is_refused(monkeypatch, tmp_path: Path, capsys) -> None:
    """A folder's identity carried no listing: a file added between the kill and --resume shifted every later
    position, so one file was embedded twice and another never."""
    folder = tmp_path / "docs"
    folder.mkdir()
    for name in "acegi":
        (folder / f"{name}.txt").write_text(f"text {name}")
    out = tmp_path / "out"
    assert run(monkeypatch, FakeEmbedder(fail_at=2), folder, out, *ONE_WINDOW_A_CALL) == 1  # window 0 committed
    (folder / "b.txt").write_text("new")
    with pytest.raises(SystemExit) as refused:
        run(monkeypatch, FakeEmbedder(), folder, out, *ONE_WINDOW_A_CALL, "--resume")
    assert "changed" in str(refused.value), refused.value
    (folder / "b.txt").unlink()
    (folder / "c.txt").write_text("same name, another size")
    with pytest.raises(SystemExit):
        run(monkeypatch, FakeEmbedder(), folder, out, *ONE_WINDOW_A_CALL, "--resume")
    (folder / "c.txt").write_text("text c")  # as it was: resumes
    assert run(monkeypatch, FakeEmbedder(), folder, out, *ONE_WINDOW_A_CALL, "--resume") == 0
    assert output(out)[0] == [f"{n}.txt" for n in "acegi"]


def test_resuming_a_file_edited_to_the_same_size_is_refused(monkeypatch, tmp_path: Path) -> None:
    """A file's identity was its size only: an edit that kept it (an id rewritten, one line's bytes moved to the
    next) resumed, and the committed windows no longer matched the input. Its mtime is part of the identity now;
    an output of the previous version (manifest version 1, size only) still resumes and records the mtime."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": f"d{i}", "text": f"text {i}"} for i in range(6)])
    out, before, stat = tmp_path / "out", src.read_bytes(), src.stat()
    assert run(monkeypatch, FakeEmbedder(fail_at=2), src, out, *ONE_WINDOW_A_CALL) == 1  # window 0 committed
    src.write_bytes(before.replace(b'"d0"', b'"x0"'))
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a coarse clock need not tick within a test
    assert src.stat().st_size == stat.st_size
    with pytest.raises(SystemExit) as refused:
        run(monkeypatch, FakeEmbedder(), src, out, *ONE_WINDOW_A_CALL, "--resume")
    message = str(refused.value)
    assert "INPUT changed" in message and "modification time" in message and "\n" not in message, message
    src.write_bytes(before)  # the same bytes again, another mtime: refused as well (the safe side)
    touched = stat.st_mtime_ns + 2 * 10**9
    os.utime(src, ns=(stat.st_atime_ns, touched))
    with pytest.raises(SystemExit, match="INPUT changed"):
        run(monkeypatch, FakeEmbedder(), src, out, *ONE_WINDOW_A_CALL, "--resume")
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["identity"]["input_mtime_ns"]
    (out / "manifest.json").write_text(json.dumps({**manifest, "version": 1}))  # as the previous version wrote it
    assert run(monkeypatch, FakeEmbedder(), src, out, *ONE_WINDOW_A_CALL, "--resume") == 0  # its size check only
    assert output(out)[0] == [f"d{i}" for i in range(6)]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["version"] == 2 and manifest["identity"]["input_mtime_ns"] == touched


def test_a_repeated_or_colliding_id_is_rejected(monkeypatch, tmp_path: Path) -> None:
    """Repeated ids were written twice, and a line number standing in for a missing id could equal a given id:
    the output held an id twice although every id is promised once. The later document is rejected (as other
    bad documents are), across a --resume too."""
    src = write_jsonl(tmp_path / "in.jsonl", [
        {"text": "first, no id: 1"}, {"id": "1", "text": "id 1"}, {"id": 1, "text": "numeric 1"},
        {"id": "x", "text": "x a"}, {"id": "x", "text": "x b"}, {"id": "y", "text": "y"}, {"id": "a", "text": ""},
        {"id": "a", "text": "after a rejected a"}, {"id": "y", "text": "y again, after the kill"}])
    out = tmp_path / "out"
    assert run(monkeypatch, FakeEmbedder(fail_at=3), src, out, *ONE_WINDOW_A_CALL) == 1  # windows 0, 1 committed
    assert run(monkeypatch, FakeEmbedder(), src, out, *ONE_WINDOW_A_CALL, "--resume") == 0
    ids, rejects = output(out)
    assert ids == ["1", "x", "y"]
    assert [(r["id"], r["position"]) for r in rejects] == [("1", 1), ("1", 2), ("x", 4), ("a", 6), ("a", 7),
                                                           ("y", 8)]
    assert all("earlier document" in r["reason"] for r in rejects if r["position"] != 6), rejects
    twice = write_jsonl(tmp_path / "twice.jsonl", [{"id": "x", "text": "one"}, {"id": "x", "text": "two"}])
    assert run(monkeypatch, FakeEmbedder(), twice, tmp_path / "ff", "--fail-fast") == 1


def test_summary_counts_the_whole_output_and_is_kept_when_nothing_is_left(monkeypatch, tmp_path: Path) -> None:
    """A resumed run's summary.json counted only its own part; resuming a complete output replaced the good
    summary with zeros."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": f"d{i}", "text": f"text {i}"} for i in range(9)]
                      + [{"id": "e", "text": ""}])
    out = tmp_path / "out"
    assert run(monkeypatch, FakeEmbedder(fail_at=3), src, out, *ONE_WINDOW_A_CALL) == 1  # 4 of 10 committed
    assert run(monkeypatch, FakeEmbedder(), src, out, *ONE_WINDOW_A_CALL, "--resume") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["documents"], summary["rejected"], summary["tokens"]) == (9, 1, 18), summary
    assert summary["this_run"] == {"documents": 5, "rejected": 1, "tokens": 10}
    before = (out / "summary.json").read_bytes()
    assert run(monkeypatch, FakeEmbedder(), src, out, "--resume", *ONE_WINDOW_A_CALL) == 0
    assert (out / "summary.json").read_bytes() == before


class Scripted:
    """A /v1/embeddings server on loopback: POSTs are answered from `answers` ((status, body, headers)) in turn,
    then 200 with rows of 4 ones."""

    def __init__(self, answers: list[tuple[int, dict, dict]] = ()) -> None:
        self.answers, self.posts = list(answers), 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def send(self, status: int, body: dict, headers: dict = {}) -> None:  # noqa: B006 (read only)
                data = json.dumps(body).encode()
                self.send_response(status)
                for k, v in {"content-type": "application/json", "content-length": str(len(data)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self.send(200, {"data": [{"id": "m", "dimensions": 4}]})

            def do_POST(self) -> None:
                texts = json.loads(self.rfile.read(int(self.headers["content-length"])))["input"]
                outer.posts += 1
                if outer.answers:
                    return self.send(*outer.answers.pop(0))
                row = base64.b64encode(np.ones(4, "<f4").tobytes()).decode()
                self.send(200, {"data": [{"index": i, "embedding": row} for i in range(len(texts))],
                                "usage": {"prompt_tokens": len(texts)}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_refused_option_is_one_line_not_a_traceback(tmp_path: Path, capsys) -> None:
    """The width probe's RowError (--dimensions 9999, --prompt-name nosuch) escaped as a traceback."""
    server = Scripted([(400, {"error": {"message": "dimensions must be at most 384", "param": "dimensions"}}, {})])
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "one"}])
    try:
        code = main(["index", str(src), str(tmp_path / "out"), "--url", server.url, "--dimensions", "9999",
                     "--progress", "off"])
    finally:
        server.close()
    err = capsys.readouterr().err
    assert code != 0 and "dimensions must be at most 384" in err and len(err.strip().splitlines()) == 1, err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_that_is_down_is_not_reported_as_no_model(tmp_path: Path, capsys) -> None:
    """GET /v1/models' connection error was swallowed: "lists no model; pass --model-name"."""
    with pytest.raises(FatalError, match="could not reach"):
        HttpEmbedder(f"http://127.0.0.1:{free_port()}", api_key="", model_name="", options={}, encoding="float",
                     timeout_s=5, retries=0)
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "one"}])
    assert main(["index", str(src), str(tmp_path / "out"), "--url", f"http://127.0.0.1:{free_port()}",
                 "--retries", "0", "--progress", "off"]) == 1
    err = capsys.readouterr().err
    assert "could not reach" in err and "no model" not in err and "--resume" not in err, err


def test_models_listing_is_retried_like_a_post(monkeypatch) -> None:
    """A 503 on GET /v1/models (a stack still starting) is retried, not taken as "no model"."""
    server = Scripted()
    calls = {"n": 0}
    real = HttpEmbedder._request

    def flaky(self, method, path, body=None):
        calls["n"] += 1
        if method == "GET" and calls["n"] == 1:
            from ivy.index.client import _Retry
            raise _Retry("could not reach the server: refused")
        return real(self, method, path, body)

    monkeypatch.setattr(HttpEmbedder, "_request", flaky)
    monkeypatch.setattr(HttpEmbedder, "_wait", lambda self, s: None, raising=False)
    try:
        emb = HttpEmbedder(server.url, api_key="", model_name="", options={}, encoding="float", timeout_s=5, retries=2)
    finally:
        server.close()
    assert emb.model_name == "m" and calls["n"] == 2


def test_retry_after_values() -> None:
    """Only whole seconds were honoured: a fraction or an HTTP-date fell back to the backoff, 86400 parked the job
    for a day."""
    from ivy.index.client import MAX_RETRY_AFTER_S, retry_after_s

    assert retry_after_s("2") == 2 and retry_after_s("2.5") == 2.5 and retry_after_s(" 0 ") == 0
    assert retry_after_s("86400") == MAX_RETRY_AFTER_S < 3600
    assert 8 <= retry_after_s(formatdate(time.time() + 10, usegmt=True)) <= 10
    assert retry_after_s(formatdate(time.time() - 100, usegmt=True)) == 0  # in the past: now
    for junk in (None, "", "soon", "-1", "nan", "inf", "1e999"):
        assert retry_after_s(junk) is None, junk


@pytest.mark.parametrize("header, waits", [("0.1", [0.5, 1.0, 2.0]), ("2.5", [2.5, 2.5, 2.5]),
                                           ("86400", "cap")])
def test_retry_after_is_honoured_without_burning_the_budget(header: str, waits) -> None:
    """A short Retry-After replaced the backoff: `--retries` attempts spent in a fraction of the backoff's time
    (Ivy answers 503 with Retry-After: 1 or 2 while no replica serves), so a brief outage stopped the job. Each
    wait is now the longer of the two: never sooner than the server asked, never faster than the backoff."""
    from ivy.index.client import MAX_RETRY_AFTER_S

    busy = (503, {"error": {"message": "no replica is serving"}}, {"Retry-After": header})
    server = Scripted([busy] * 4)
    slept: list[float] = []
    try:
        emb = HttpEmbedder(server.url, api_key="", model_name="", options={}, encoding="float", timeout_s=5,
                           retries=3)
        emb._wait = slept.append
        with pytest.raises(FatalError, match="4 times"):
            emb.embed(["a"])
    finally:
        server.close()
    assert slept == ([MAX_RETRY_AFTER_S] * 3 if waits == "cap" else waits)


def test_a_json_array_file_is_read_as_records(monkeypatch, tmp_path: Path) -> None:
    """A .json file holding an array was read as JSONL: every line rejected, exit 0."""
    src = tmp_path / "in.json"
    src.write_text('[{"id": "a", "text": "x"},\n {"id": "b", "text": "y"},\n {"text": "z"}, 5]\n')
    assert run(monkeypatch, FakeEmbedder(), src, tmp_path / "out") == 0
    ids, rejects = output(tmp_path / "out")
    assert ids == ["a", "b", "3"] and [(r["id"], r["position"]) for r in rejects] == [("4", 3)]
    assert [d.id for d in read_docs(src, "json", "id", "text", start=2)] == ["3", "4"]
    (tmp_path / "bad.json").write_text('[{"id": "a", "text": "x"},\n')
    with pytest.raises(SystemExit, match="not valid JSON"):
        run(monkeypatch, FakeEmbedder(), tmp_path / "bad.json", tmp_path / "out2")


def test_ctrl_c_exits_130_with_one_line(monkeypatch, tmp_path: Path, capsys) -> None:
    """Ctrl-C printed a KeyboardInterrupt traceback."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": f"d{i}", "text": f"text {i}"} for i in range(6)])
    out = tmp_path / "out"
    try:
        code = run(monkeypatch, FakeEmbedder(fail_at=2, error=KeyboardInterrupt()), src, out, *ONE_WINDOW_A_CALL)
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped ivy index")
    assert code == 130
    err = capsys.readouterr().err
    assert "--resume" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert run(monkeypatch, FakeEmbedder(), src, out, *ONE_WINDOW_A_CALL, "--resume") == 0
    assert output(out)[0] == [f"d{i}" for i in range(6)]
