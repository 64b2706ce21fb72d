"""`ivy up`'s stop flag: set from a signal handler while the main thread waits on it (RELIABILITY: a stack must
stop on SIGTERM / SIGHUP). A threading.Event here once hung `ivy up` under load: its set(), run by the handler,
took the lock the interrupted wait() held in the same thread."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

from ivy.up import StopFlag


def test_a_signal_during_many_short_waits_always_stops_the_wait() -> None:
    rng = random.Random(0)
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        for _ in range(100):
            flag = StopFlag()
            signal.signal(signal.SIGUSR1, flag.set)
            threading.Timer(rng.uniform(0, 0.004), os.kill, (os.getpid(), signal.SIGUSR1)).start()
            start = time.monotonic()
            while not flag.wait(0.0005):  # many waits ending on their timeout: the windows a lock would have
                assert time.monotonic() - start < 5, "the signal did not stop the wait"
            assert flag.is_set()
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_wait_times_out_unset_and_returns_at_once_when_set() -> None:
    flag = StopFlag()
    start = time.monotonic()
    assert flag.wait(0.12) is False
    assert 0.1 <= time.monotonic() - start < 2
    flag.set()
    start = time.monotonic()
    assert flag.wait(10) is True
    assert time.monotonic() - start < 0.5
