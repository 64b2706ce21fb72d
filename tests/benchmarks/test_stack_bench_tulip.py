"""The tulip-grpc layer's client against a fake gRPC Tulip: stream and unary, errors, late answers."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from bench_fake_tulip import FakeTulipThread, start_fake_tulip
from stack_bench_fake import MODEL, FakeStack

from benchmarks.stack.__main__ import EXIT_SERVER, main
from benchmarks.stack.client import StackError
from benchmarks.stack.tulip_client import TulipClient

SEQS = ((101, 7592, 2088, 102), (101, 2204, 2851, 2000, 102))


@pytest.fixture()
def tulip(fake_stack: FakeStack) -> Iterator[FakeTulipThread]:
    server = start_fake_tulip(fake_stack)
    yield server
    server.close()


@pytest.mark.parametrize("call", ["stream", "unary"])
def test_embeds_token_ids_over_either_call(tulip: FakeTulipThread, fake_stack: FakeStack, call: str) -> None:
    with TulipClient(tulip.address, call, timeout_s=5.0) as client:
        matrix, tokens = client.embed_matrix(SEQS)
        samples = [client.embed_ids(SEQS, 1, score=True) for _ in range(5)]
        assert client.max_length() == 512
    np.testing.assert_allclose(matrix, fake_stack.embed([list(s) for s in SEQS]), rtol=1e-6)
    assert tokens == 9 and tulip.servicer.received[:2] == [list(s) for s in SEQS]
    assert all(s.ok and s.items == 1 and s.tokens == 9 and s.tokens_from_usage for s in samples)
    calls = tulip.servicer.calls
    if call == "stream":  # one long-lived stream for every request of the client
        assert calls["EmbedStream"] == 1 and calls["stream-messages"] == 6 and calls["Embed"] == 0
    else:
        assert calls["Embed"] == 6 and calls["EmbedStream"] == 0


@pytest.mark.parametrize("call", ["stream", "unary"])
def test_a_failed_request_is_a_stack_error_with_its_status(tulip: FakeTulipThread, call: str) -> None:
    tulip.servicer.fail_over_seqs = 1
    with TulipClient(tulip.address, call, timeout_s=5.0) as client:
        with pytest.raises(StackError, match="DEADLINE_EXCEEDED") as caught:
            client.embed_matrix(SEQS)
        assert caught.value.status == 504
        assert client.embed_matrix(SEQS[:1])[0].shape == (1, 32)  # the stream survives a failed request


def test_a_stream_request_past_its_deadline_is_cancelled_and_its_late_answer_skipped(tulip: FakeTulipThread) -> None:
    tulip.servicer.delay_token, tulip.servicer.delay_s = 999, 2.0  # far past 0.1 s, also on a stalled host
    with TulipClient(tulip.address, "stream", timeout_s=0.1) as client:
        with pytest.raises(StackError, match="DEADLINE_EXCEEDED"):
            client.embed_matrix(((999, 5, 6),))
        client.timeout_s = 5.0
        matrix, tokens = client.embed_matrix(SEQS)  # the late answer to request 1 comes first: skipped
    assert matrix.shape == (2, 32) and tokens == 9
    assert tulip.servicer.cancelled == [1]


def test_an_unreachable_tulip_is_a_clear_error(minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["--tulip", "127.0.0.1:9", "--model", MODEL, "--out", str(tmp_path), "--skip-verify", "true",
            "--timeout-s", "2", "--tokenizer", str(minilm_dir)]
    assert main(argv) == EXIT_SERVER
    assert "cannot reach 127.0.0.1:9" in capsys.readouterr().err


def test_tulip_direct_run_records_a_failing_step_and_writes_the_file(
        tulip: FakeTulipThread, minilm_dir: Path, tmp_path: Path) -> None:
    tulip.servicer.fail_over_seqs = 2  # every throughput batch (3 documents) ends as a 504 would
    argv = ["--tulip", tulip.address, "--model", MODEL, "--out", str(tmp_path), "--skip-verify", "true",
            "--tokenizer", str(minilm_dir), "--suite", "throughput,embed-latency", "--embed-tokens", "16",
            "--requests", "3", "--warmup-requests", "1", "--distinct-inputs", "2", "--throughput-processes", "1",
            "--throughput-batch", "3", "--duration-s", "5"]
    assert main(argv) == EXIT_SERVER
    result = json.loads((tmp_path / f"stack_{MODEL}.json").read_text())
    failed, measured = result["records"]
    assert failed["suite"] == "throughput" and "DEADLINE_EXCEEDED" in failed["error"] and failed["p99_ms"] is None
    assert measured["suite"] == "embed-latency" and "error" not in measured
    assert measured["p50_ms"] > 0 and measured["tokens_per_request"] == 16 and measured["input"] == "ids"
    assert result["env"]["server"]["info"]["max_batch_tokens"] == 256


@pytest.mark.parametrize("call", ["stream", "unary"])
def test_against_the_real_tulip_server_with_its_fake_engine(call: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tulip"))
    testkit = pytest.importorskip("tulip_testkit")
    seqs = (tuple(range(3, 40)), (7, 8, 9), tuple(range(100, 228)))
    with testkit.ServerThread(testkit.make_config(), testkit.FakeEngine()) as server, \
            TulipClient(server.address, call, 10.0) as client:
        matrix, tokens = client.embed_matrix(seqs)
        sample = client.embed_ids(seqs[:2], 1, score=True)
        assert client.info()["model_id"] == "fake-model"
    np.testing.assert_array_equal(matrix, testkit.solo_embedding(testkit.encode_request(seqs)))
    assert tokens == sum(map(len, seqs)) and sample.ok and sample.items == 1
