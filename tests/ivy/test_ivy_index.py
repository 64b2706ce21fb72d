"""`ivy index`: readers and ids, the Parquet layout, a corpus through a real gateway (fake Tulip) and in-process,
equality with /v1/embeddings, rejects, and a SIGKILL mid-run then --resume with every id exactly once."""

from __future__ import annotations

import base64
import csv
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fake_tulip import FakeTulip
from ivy.cli import main
from ivy.index.sink import Sink
from ivy.index.sources import read_docs
from ivy_testkit import MODEL, ivy_server

TEXTS = [f"document number {i}: " + "words " * (i % 7) for i in range(23)]
LONG = "tokens " * 400  # over MiniLM's 256 tokens


@pytest.fixture(scope="module")
def url():
    with FakeTulip() as fake, ivy_server(IVY_REPLICAS=fake.address) as (port, _):
        yield f"http://127.0.0.1:{port}", fake


def write_jsonl(path: Path, records: list) -> Path:
    path.write_bytes(b"".join(r if isinstance(r, bytes) else (json.dumps(r) + "\n").encode() for r in records))
    return path


def index(*args) -> int:
    return main(["index", *map(str, args), "--progress", "log"])


def read_output(folder: Path) -> tuple[list[str], np.ndarray | list, list[dict]]:
    tables = [pq.read_table(p) for p in sorted(folder.glob("part-*.parquet"))]
    table = pa.concat_tables(tables)
    emb = table.column("embedding")
    values = np.array(emb.to_pylist(), np.float32) if pa.types.is_fixed_size_list(emb.type) else emb.to_pylist()
    rejects = [json.loads(line) for line in (folder / "rejects.jsonl").read_text().splitlines()]
    return table.column("id").to_pylist(), values, rejects


def server_embeddings(base: str, texts: list[str], fmt: str = "float", **options) -> list:
    body = json.dumps({"model": MODEL, "input": texts, "encoding_format": fmt, **options}).encode()
    req = urllib.request.Request(base + "/v1/embeddings", body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        data = sorted(json.loads(r.read())["data"], key=lambda d: d["index"])
    return [d["embedding"] if fmt == "float" else base64.b64decode(d["embedding"]) for d in data]


def test_readers_each_format_and_ids(tmp_path: Path) -> None:
    jl = write_jsonl(tmp_path / "a.jsonl", [{"id": "x", "text": "one"}, {"text": "two"}, b"\n", b"{oops\n",
                                            b'{"text": "\xff\xfe"}\n', {"text": ""}, {"id": 7, "text": "three"}])
    docs = list(read_docs(jl, "jsonl", "id", "text"))
    assert [(d.pos, d.id, d.text) for d in docs] == [(0, "x", "one"), (1, "2", "two"), (2, "4", None),
                                                     (3, "5", None), (4, "6", None), (5, "7", "three")]
    assert [d.reason.split(":")[0] for d in docs if d.text is None] == [
        "line is not JSON", "line is not valid UTF-8", "empty text"]
    assert [d.id for d in read_docs(jl, "jsonl", "id", "text", start=4)] == ["6", "7"]
    with open(tmp_path / "b.csv", "w", newline="") as f:
        csv.writer(f).writerows([["key", "body"], ["k1", "alpha, with comma"], ["", "beta\nmultiline"], ["k3", ""]])
    docs = list(read_docs(tmp_path / "b.csv", "csv", "key", "body"))
    assert [(d.id, d.text) for d in docs] == [("k1", "alpha, with comma"), ("2", "beta\nmultiline"), ("k3", None)]
    pq.write_table(pa.table({"text": ["p", "q", "r"]}), tmp_path / "c.parquet", row_group_size=2)
    assert [(d.id, d.text) for d in read_docs(tmp_path / "c.parquet", "parquet", "id", "text", start=1)] == [
        ("2", "q"), ("3", "r")]
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("bee")
    (folder / "sub" / "a.md").write_text("ay")
    (folder / ".hidden").write_text("no")
    (folder / "bad.txt").write_bytes(b"\xff")
    docs = list(read_docs(folder, "text", "id", "text"))
    assert [(d.id, d.text) for d in docs] == [("b.txt", "bee"), ("bad.txt", None), ("sub/a.md", "ay")]


def test_gateway_corpus_schema_metadata_rejects_and_equality(url, tmp_path: Path) -> None:
    base, _ = url
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS)]
    records[3] = {"id": "d3", "text": LONG}
    records[5] = {"id": "d5", "text": "  "}
    src = write_jsonl(tmp_path / "in.jsonl", records)
    assert index(src, tmp_path / "out", "--url", base, "--batch-size", 4, "--sort-window", 10) == 0
    schema = pq.read_schema(tmp_path / "out" / "part-000000.parquet")
    assert schema.field("embedding").type == pa.list_(pa.float32(), 384)
    assert {k: schema.metadata[k.encode()].decode() for k in ("model", "dimensions", "encoding")} == {
        "model": MODEL, "dimensions": "384", "encoding": "float"}
    assert len(list((tmp_path / "out").glob("part-*.parquet"))) == 3  # 23 documents, windows of 10
    ids, emb, rejects = read_output(tmp_path / "out")
    assert [(r["id"], r["reason"].split(" ")[0]) for r in rejects] == [("d3", "text"), ("d5", "empty")]
    assert "256" in rejects[0]["reason"]
    good = [r for r in records if r["id"] not in ("d3", "d5")]
    assert ids == [r["id"] for r in good]  # each shard in input order
    want = np.array(server_embeddings(base, [r["text"] for r in good]), np.float32)
    np.testing.assert_allclose(emb, want, rtol=1e-6, atol=1e-7)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["documents"] == len(good) and summary["rejected"] == 2 and summary["tokens"] > 0
    with pytest.raises(SystemExit):  # a second run into the same folder needs --resume
        index(src, tmp_path / "out", "--url", base)


@pytest.mark.parametrize("fmt", ["base64_int8", "base64_binary"])
def test_gateway_byte_encodings_and_dimensions(url, tmp_path: Path, fmt: str) -> None:
    base, _ = url
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": TEXTS[:9]}), src)
    assert index(src, tmp_path / "out", "--url", base, "--encoding", fmt, "--dimensions", 64) == 0
    schema = pq.read_schema(tmp_path / "out" / "part-000000.parquet")
    assert schema.field("embedding").type == pa.binary()
    assert schema.metadata[b"dimensions"] == b"64" and schema.metadata[b"encoding"] == fmt.encode()
    ids, emb, _ = read_output(tmp_path / "out")
    assert ids == [str(i) for i in range(1, 10)]  # row numbers
    assert emb == server_embeddings(base, TEXTS[:9], fmt, dimensions=64)


def test_a_refused_document_in_a_batch_is_found_and_fail_fast_stops(url, tmp_path: Path) -> None:
    base, _ = url
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in TEXTS[:6]] + [{"text": LONG}])
    assert index(src, tmp_path / "a", "--url", base, "--batch-size", 7) == 0
    ids, emb, rejects = read_output(tmp_path / "a")
    assert ids == [str(i) for i in range(1, 7)] and [r["id"] for r in rejects] == ["7"]
    assert index(src, tmp_path / "b", "--url", base, "--fail-fast") == 1
    assert index(src, tmp_path / "c", "--url", base, "--truncate") == 0
    assert len(read_output(tmp_path / "c")[0]) == 7


def test_sink_resume_drops_what_the_manifest_does_not_name(tmp_path: Path) -> None:
    from ivy.index.sink import Layout

    layout = Layout("m", 2, "float")
    sink = Sink(tmp_path, {"k": 1}, resume=False)
    sink.commit(0, 0, 2, layout.table(["a", "b"], np.ones((2, 2)), {}), [{"id": "c", "reason": "r"}], 3)
    sink.close()
    (tmp_path / "part-000001.parquet").write_bytes(b"renamed, manifest not yet replaced")
    (tmp_path / "part-000002.parquet.tmp").write_bytes(b"half written")
    with open(tmp_path / "rejects.jsonl", "a") as f:
        f.write('{"id": "uncommitted"}\n')
    with pytest.raises(SystemExit):
        Sink(tmp_path, {"k": 2}, resume=True)  # other options: refused
    sink = Sink(tmp_path, {"k": 1}, resume=True)
    assert sink.next_window == 1 and sorted(p.name for p in tmp_path.iterdir()) == [
        "manifest.json", "part-000000.parquet", "rejects.jsonl"]
    assert (tmp_path / "rejects.jsonl").read_text().count("\n") == 1
    sink.close()


def test_sigkill_mid_run_then_resume_has_every_id_exactly_once(url, tmp_path: Path) -> None:
    base, fake = url
    n = 400
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": f"x{i}", "text": f"text {i} " + "w " * (i % 9)} for i in range(n)]
                      + [{"id": "empty", "text": ""}])
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "ivy", "index", str(src), str(out), "--url", base, "--sort-window", "20",
            "--batch-size", "4", "--concurrency", "2", "--progress", "off"]
    fake.delay_s = 0.02  # ~1 s of work per 20 shards: time to kill it in the middle
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not (out / "manifest.json").exists() or not json.loads((out / "manifest.json").read_text())["shards"]:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        proc.stderr.close()
        manifest = json.loads((out / "manifest.json").read_text())
        assert not manifest["complete"] and 1 <= len(manifest["shards"]) < 21
    finally:
        fake.delay_s = 0.0
    done = subprocess.run(argv + ["--resume"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ids, emb, rejects = read_output(out)
    assert sorted(ids) == sorted(f"x{i}" for i in range(n)) and len(ids) == len(set(ids)) == n
    assert [r["id"] for r in rejects] == ["empty"]
    assert json.loads((out / "manifest.json").read_text())["complete"]
    by_id = dict(zip(ids, emb))
    want = server_embeddings(base, ["text 7 " + "w " * 7, "text 390 " + "w " * 3])
    np.testing.assert_allclose([by_id["x7"], by_id["x390"]], want, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_in_process_equals_v1_embeddings_through_a_real_tulip(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).parents[1] / "tulip"))
    try:
        from tulip_testkit import ServerThread, make_config
    finally:
        sys.path.pop(0)

    folder = tmp_path / "corpus"
    folder.mkdir()
    for i, text in enumerate(TEXTS[:10] + [LONG]):
        (folder / f"{i:02d}.txt").write_text(text)
    with ServerThread(make_config(max_batch_tokens=2048, max_batch_seqs=16)) as tulip, \
            ivy_server(IVY_REPLICAS=tulip.address) as (port, _):
        base = f"http://127.0.0.1:{port}"
        assert index(folder, tmp_path / "remote", "--url", base, "--batch-size", 3) == 0
        assert index(folder, tmp_path / "local", "--model", "bundled", "--batch-size", 3) == 0
        want = np.array(server_embeddings(base, TEXTS[:10]), np.float32)
    for name in ("remote", "local"):
        ids, emb, rejects = read_output(tmp_path / name)
        assert ids == [f"{i:02d}.txt" for i in range(10)] and [r["id"] for r in rejects] == ["10.txt"]
        np.testing.assert_allclose(emb, want, atol=2e-5)
    local = pq.read_schema(tmp_path / "local" / "part-000000.parquet")
    assert local.metadata == pq.read_schema(tmp_path / "remote" / "part-000000.parquet").metadata


def test_lone_surrogate_escapes_are_rejected_not_fatal(url, tmp_path: Path) -> None:
    """JSON lets a line carry "\\ud800" (a lone UTF-16 surrogate, valid JSON, not encodable as UTF-8). In a text
    the server answered 400 about the body (param "body"), which stopped the job as an option error; in an id,
    the shard's and rejects.jsonl's UTF-8 encoding raised: the job died with a traceback. Either way --resume
    stopped at the same window for good. Such a line is an undecodable document: rejected, the rest embedded."""
    base, _ = url
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": TEXTS[0]}, b'{"id": "b", "text": "bad \\udc00"}\n',
                                              b'{"id": "\\ud800", "text": "fine"}\n', {"id": "d", "text": TEXTS[1]}])
    assert index(src, tmp_path / "out", "--url", base) == 0
    ids, _, rejects = read_output(tmp_path / "out")
    assert ids == ["a", "d"]
    assert [(r["id"], r["position"]) for r in rejects] == [("b", 1), ("3", 2)]  # a bad id: the line number
    assert all("surrogate" in r["reason"] for r in rejects), rejects


def test_a_batch_over_the_servers_body_limit_is_split_not_fatal(url, tmp_path: Path) -> None:
    """A batch whose body passes the server's payload limit (Ivy: 2 MiB) is answered 413 about the body, not about
    a document: it stopped the job (exit 1) as an option error, and --resume stopped there again. Long documents
    with --truncate are ordinary work: the batch is split until it fits, one document over the limit alone is
    rejected. (Each body here stays under twice the limit, which Ivy reads to its end before answering.)"""
    base, _ = url
    big = [{"id": f"big{i}", "text": f"{i} " + "long words " * 40_000} for i in range(6)]  # ~440 KB each
    huge = {"id": "huge", "text": "w " * (1_600_000)}  # 3.2 MB: over the limit alone
    src = write_jsonl(tmp_path / "in.jsonl", [*big, huge, {"id": "small", "text": TEXTS[2]}])
    # by length: [small, big0..big5] (2.6 MB, over the limit), then [huge]
    assert index(src, tmp_path / "out", "--url", base, "--truncate", "--batch-size", 7) == 0
    ids, _, rejects = read_output(tmp_path / "out")
    assert sorted(ids) == sorted([d["id"] for d in big] + ["small"])
    assert [r["id"] for r in rejects] == ["huge"] and "limit" in rejects[0]["reason"], rejects


def test_a_kill_before_the_first_manifest_still_resumes(tmp_path: Path, monkeypatch) -> None:
    """The first shard is renamed into place before the first manifest is written: a kill between the two left
    a shard and no manifest, and `--resume` refused the folder ("holds shards but no manifest.json")."""
    from ivy.index.sink import Layout

    layout = Layout("m", 2, "float")
    sink = Sink(tmp_path, {"k": 1}, resume=False)

    def killed(self) -> None:
        raise KeyboardInterrupt("killed before the manifest")

    monkeypatch.setattr(Sink, "_save", killed)
    with pytest.raises(KeyboardInterrupt):
        sink.commit(0, 0, 2, layout.table(["a", "b"], np.ones((2, 2)), {}), [], 3)
    sink.close()
    monkeypatch.undo()
    assert (tmp_path / "part-000000.parquet").exists()
    sink = Sink(tmp_path, {"k": 1}, resume=True)
    assert sink.next_window == 0 and not (tmp_path / "part-000000.parquet").exists()
    sink.close()


def test_a_byte_order_mark_is_not_part_of_the_first_field(tmp_path: Path) -> None:
    """Excel's "CSV UTF-8" and Windows tools start the file with a BOM: it stuck to the first header (the id
    column was not found and every id silently became the row number) and made the first JSONL line not JSON."""
    (tmp_path / "a.csv").write_bytes(b"\xef\xbb\xbfkey,body\nk1,alpha\nk2,beta\n")
    assert [(d.id, d.text) for d in read_docs(tmp_path / "a.csv", "csv", "key", "body")] == [
        ("k1", "alpha"), ("k2", "beta")]
    (tmp_path / "b.jsonl").write_bytes(b'\xef\xbb\xbf{"id": "x", "text": "one"}\n{"id": "y", "text": "two"}\n')
    assert [(d.id, d.text) for d in read_docs(tmp_path / "b.jsonl", "jsonl", "id", "text")] == [
        ("x", "one"), ("y", "two")]


def test_an_option_the_gateway_refuses_is_one_line(url, tmp_path: Path, capsys) -> None:
    """--dimensions over the model's width: the width probe's RowError escaped as a traceback."""
    base, _ = url
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": TEXTS[0]}])
    assert index(src, tmp_path / "out", "--url", base, "--dimensions", 9999) == 1
    err = capsys.readouterr().err.strip()
    assert "refused this job's options" in err and "dimensions" in err and "Traceback" not in err, err
