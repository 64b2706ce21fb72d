"""The server's own account of a request's time (Ivy's timing headers, Tulip's EmbedResponse fields) read per
request and summarized as medians beside the client's percentiles."""

import math

import pytest

from benchmarks.stack.client import TIMING_KEYS, Sample, timing_of
from benchmarks.stack.report import summarize


def test_timing_headers_are_read_in_milliseconds_and_missing_ones_are_nan() -> None:
    full = timing_of({"x-total-time": "1.250", "x-tokenization-time": "0.100", "x-queue-time": "0.020",
                      "x-inference-time": "1.000", "x-batcher-time": "1.100"})
    assert full == (1.25, 0.1, 0.02, 1.0, 1.1)
    refused = timing_of({"x-total-time": "0.300", "x-tokenization-time": "0.000", "x-request-id": "r"})
    assert refused[:2] == (0.3, 0.0) and all(math.isnan(v) for v in refused[2:])
    assert timing_of({"content-type": "application/json"}) is None
    assert timing_of({"x-total-time": "soon"}) is None  # unreadable counts as not sent


def test_a_record_has_the_medians_of_what_the_server_reported() -> None:
    nan = float("nan")
    samples = [Sample(i * 0.01, 0.003, 1, 10, True, timing=(2.0 + i, 0.1, 0.01, 1.2, 1.5), client_cpu_s=2e-4)
               for i in range(5)]
    samples.append(Sample(1.0, 0.003, 1, 10, True, timing=(9.0, 0.1, nan, nan, nan)))  # answered before Tulip
    samples.append(Sample(1.1, 0.003, 1, 10, True))  # no headers at all (a peer's server)
    record = summarize("embed-latency", 128, samples)
    timing = record["server_timing_p50_ms"]
    assert set(timing) == set(TIMING_KEYS)
    assert timing["ivy_total"] == pytest.approx(4.5)  # over the six that sent it
    assert timing["inference"] == pytest.approx(1.2) and timing["batcher"] == pytest.approx(1.5)
    assert record["client_cpu_p50_ms"] == pytest.approx(0.2)  # over the five that measured it
    bare = summarize("embed-latency", 128, [Sample(0.0, 0.003, 1, 10, True)])
    assert "server_timing_p50_ms" not in bare and "client_cpu_p50_ms" not in bare
