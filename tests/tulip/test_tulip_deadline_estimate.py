"""Deadline-aware admission refuses only what is certainly unmeetable: its estimate (DeviceTimes' Pace,
tulip/pacing.py) is a lower bound on the device time of the work ahead plus the request's own.

The defect this guards: the per-token rate of small batches (a 1-token batch of 20 ms reads 20 ms a token,
almost all of it the batch's fixed cost) was extrapolated to large requests, so an idle replica that had only
served single queries refused a 2048-token request with any reasonable deadline ("at least 42 s" for one
batch of ~20 ms), with a retry-after of 0.000, and never learnt better: the refused requests never ran."""

import grpc
import pytest

from tulip.errors import DeadlineUnmeetable, error_metadata
from tulip.lanes import check_deadline
from tulip.pacing import DeviceTimes
from tulip.scheduler import BULK, INTERACTIVE
from tulip_testkit import FakeEngine, ServerThread, encode_request, make_config


def test_an_idle_replica_that_served_only_single_queries_admits_a_large_request() -> None:
    """The reviewer's probe (b_deadline_adm.py): 20 ms a batch, ten 1-token queries, then one 2048-token
    request (one batch, ~20 ms) with a deadline of seconds on an empty queue: it is served, not refused."""
    with ServerThread(make_config(framed_port=0, max_batch_tokens=2048, max_queue_tokens=65536),
                      FakeEngine(step_seconds=0.02)) as s:
        for _ in range(10):
            s.stub.Embed(encode_request([[7]]), timeout=5)
        big = encode_request([[i % 900 + 1 for i in range(128)] for _ in range(16)])  # 2048 tokens
        for timeout in (5, 30):  # seconds of room for a stalled host; the old estimate was ~42 s
            assert s.stub.Embed(big, timeout=timeout).rows == 16


def test_small_batches_bound_a_large_request_by_one_batch_not_by_their_per_token_rate() -> None:
    for budget in (None, 2048):  # the budget unknown, or known
        times = DeviceTimes(max_batch_tokens=budget)
        for _ in range(10):
            times.observe(1, 0.02)  # 20 ms a token, all of it fixed cost
        pace = times.pace()
        assert times.seconds_per_token() == pace.fastest == pytest.approx(0.02)  # still the fastest rate seen
        assert pace.least_seconds(2048) == pytest.approx(0.02)  # but 2048 tokens may be one batch of ~20 ms
        check_deadline(INTERACTIVE, 0, 2048, 1.0, pace)  # admitted
        check_deadline(BULK, 2048, 2048, 1.0, pace)  # 2 batches at least: 40 ms
        with pytest.raises(DeadlineUnmeetable):  # what is certain still refuses: it takes at least one batch
            check_deadline(INTERACTIVE, 0, 2048, 0.01, pace)


def test_a_rate_measured_at_the_budget_bounds_any_amount_of_work() -> None:
    """Every batch holds at most the budget, so one measured at (or above) it is at least as large as any the
    work can be split into: its per-token rate bounds them all (the existing server test's numbers)."""
    times = DeviceTimes(max_batch_tokens=32)
    times.observe(32, 1.6)  # 50 ms a token on a full batch
    pace = times.pace()
    assert pace.least_seconds(110) == pytest.approx(5.5)
    with pytest.raises(DeadlineUnmeetable) as err:
        check_deadline(BULK, 100, 10, 3.0, pace)
    assert err.value.retry_after_s == pytest.approx(5.0)  # the 100 tokens ahead at that rate
    # Without the budget, 110 tokens may be one batch of 110, which takes at least the 32-token batch's 1.6 s.
    unknown = DeviceTimes()
    unknown.observe(32, 1.6)
    assert unknown.pace().least_seconds(110) == pytest.approx(1.6)
    check_deadline(BULK, 100, 10, 3.0, unknown.pace())


def test_work_past_every_measured_size_counts_its_least_number_of_batches() -> None:
    times = DeviceTimes(max_batch_tokens=64)
    times.observe(16, 0.1)  # 6.25 ms a token on 16
    # 200 tokens in batches of at most 64: the fewest batches are 3 full ones (each at least as long as the
    # measured 16-token one) and one of 8 (at least 8 tokens at the 16-token batch's rate).
    assert times.pace().least_seconds(200) == pytest.approx(3 * 0.1 + 8 * 0.1 / 16)
    assert times.pace().least_seconds(10) == pytest.approx(10 * 0.1 / 16)  # fits the measured size


def test_the_bound_takes_the_fastest_of_the_classes_that_cover_the_work_and_ignores_a_slow_capture() -> None:
    times = DeviceTimes(max_batch_tokens=4096)
    for s in (0.010, 0.011, 0.300, 0.010):  # one lazy graph capture among replays
        times.observe(4096, s)
    times.observe(1500, 0.0045)  # 3 us a token
    times.observe(100, 0.005)  # 50 us a token: smaller than the work below, so it does not bound it per token
    pace = times.pace()
    full_rate = 0.0105 / 4096  # the median of the 4096-token batches, the capture dropped
    assert pace.least_seconds(8192) == pytest.approx(8192 * full_rate)  # only the full batches cover the budget
    assert pace.least_seconds(1000) == pytest.approx(1000 * full_rate)  # the faster of the two that cover 1000
    assert pace.least_seconds(50) == pytest.approx(50 * full_rate)


def test_the_bound_never_exceeds_the_fastest_rate_seen_where_a_smaller_class_was_faster() -> None:
    times = DeviceTimes(max_batch_tokens=8192)
    times.observe(8192, 0.2)  # 24 us a token on full batches (say, long sequences)
    times.observe(1000, 0.01)  # 10 us a token on smaller ones: per-token time fell with the size here
    assert times.pace().least_seconds(5000) == pytest.approx(5000 * 1e-5)  # not 5000 x 24 us


def test_a_request_that_alone_exceeds_its_deadline_gets_no_retry_after() -> None:
    """Retrying with the same deadline cannot succeed when the request's own work exceeds it: no estimate of
    when to retry (not 0.000, which reads "retry now"); with work ahead that the request alone fits behind,
    the estimate is that work's least time."""
    times = DeviceTimes(max_batch_tokens=2048)
    times.observe(2048, 0.02)
    pace = times.pace()
    with pytest.raises(DeadlineUnmeetable) as err:
        check_deadline(INTERACTIVE, 0, 2048, 0.005, pace)
    assert err.value.retry_after_s is None and "longer deadline" in err.value.message
    assert error_metadata(err.value) == (("tulip-reason", "deadline_unmeetable"),)
    with pytest.raises(DeadlineUnmeetable) as err:
        check_deadline(INTERACTIVE, 4096, 2048, 0.005, pace)
    assert err.value.retry_after_s is None  # ahead or not, its own 20 ms exceed 5 ms
    with pytest.raises(DeadlineUnmeetable) as err:
        check_deadline(BULK, 4096, 2048, 0.05, pace)
    assert err.value.retry_after_s == pytest.approx(0.04)  # the 4096 ahead; it alone fits in 50 ms
    check_deadline(BULK, 4096, 2048, 0.07, pace)
