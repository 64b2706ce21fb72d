"""TULIP_ACTIVITY_FILE: a replica counts its launched batches in a shared 8-byte file (protos/heartbeat.py) that
`ivy up` reads to run its warm-cores loops only while the replica works."""

from __future__ import annotations

from protos.heartbeat import Heartbeat, read_count
from tulip_testkit import FakeEngine, ServerThread, encode_request, make_config, marked_sequence


def test_the_count_is_read_as_written_and_none_before_it_exists(tmp_path) -> None:
    path = str(tmp_path / "count")
    assert read_count(path) is None  # the replica has not started it
    beat = Heartbeat(path)
    assert read_count(path) == 0
    beat.beat()
    beat.beat()
    assert read_count(path) == 2
    again = Heartbeat(path)  # a restarted replica goes on from the file's count: readers only see it move
    again.beat()
    assert read_count(path) == 3
    (tmp_path / "short").write_bytes(b"\1\2")
    assert read_count(str(tmp_path / "short")) is None


def test_a_replica_counts_each_batch_it_launches(tmp_path) -> None:
    path = str(tmp_path / "tulip0.count")
    with ServerThread(make_config(activity_file=path), FakeEngine()) as s:
        before = read_count(path)
        assert before is not None  # made at start, before any request
        for k in range(3):
            s.stub.Embed(encode_request([marked_sequence(10 + k, 8)]), timeout=10)
        assert read_count(path) >= before + 3  # one batch each, sent one after another


def test_no_file_by_default(tmp_path) -> None:
    assert make_config().activity_file == ""
    with ServerThread(make_config(), FakeEngine()) as s:
        s.stub.Embed(encode_request([marked_sequence(5, 8)]), timeout=10)
        assert s.server.worker.heartbeat is None
