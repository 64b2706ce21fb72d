"""TULIP_ACTIVITY_FILE: a replica on a GPU counts its launched batches in a shared 8-byte file
(protos/heartbeat.py) that `ivy up` reads to run its warm-cores loops only while the replica works."""

from __future__ import annotations

import logging
import os

from protos.heartbeat import CountReader, Heartbeat, read_count
from tulip.server import _heartbeat
from tulip_testkit import FakeEngine, FakeInfo, ServerThread, encode_request, make_config, marked_sequence


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


def test_a_reader_keeps_reading_after_the_name_is_removed(tmp_path) -> None:
    path = str(tmp_path / "count")
    beat = Heartbeat(path)
    reader = CountReader(path)
    os.unlink(path)  # `ivy up` removes its counters' folder when it stops, the readers still open
    beat.beat()
    assert reader.read() == 1
    reader.close()


def test_a_replica_on_a_gpu_counts_each_batch_it_launches(tmp_path) -> None:
    path = str(tmp_path / "tulip0.count")
    with ServerThread(make_config(activity_file=path), FakeEngine(FakeInfo(device="cuda:0"))) as s:
        before = read_count(path)
        assert before is not None  # made at start, before any request
        for k in range(3):
            s.stub.Embed(encode_request([marked_sequence(10 + k, 8)]), timeout=10)
        assert read_count(path) >= before + 3  # one batch each, sent one after another


def test_no_counter_by_default_nor_on_a_cpu(tmp_path) -> None:
    """Beside a replica on the CPU the loops would take the model's cores: no counter, so `ivy up` starts none."""
    assert make_config().activity_file == ""
    path = str(tmp_path / "tulip0.count")
    with ServerThread(make_config(activity_file=path), FakeEngine()) as s:  # FakeInfo's device: cpu
        s.stub.Embed(encode_request([marked_sequence(5, 8)]), timeout=10)
        assert s.server.worker.heartbeat is None and read_count(path) is None


def test_a_counter_that_cannot_be_made_costs_only_the_counter(tmp_path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="tulip"):
        assert _heartbeat(str(tmp_path / "missing" / "tulip0.count"), "cuda:0") is None
    assert "no batch counter" in caplog.text
    assert _heartbeat(str(tmp_path / "ok.count"), "cuda:0") is not None
    assert _heartbeat("", "cuda:0") is None
