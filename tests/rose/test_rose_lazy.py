"""PinnedPool (byte cap, reuse, backpressure, typed timeout) and LazyTensor (view, result, release, await)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from rose_parity import random_seqs

from rose import Batch
from rose.lazy import VIEWS_KEPT, LazyTensor, LazyTensorReleased, PinnedPool, PinnedPoolExhausted, size_class


def test_size_classes_are_powers_of_two():
    assert size_class(1) == 4096 and size_class(4096) == 4096 and size_class(4097) == 8192
    assert size_class(3 << 20) == 4 << 20


def test_buffers_are_reused_and_accounted():
    pool = PinnedPool(64 << 10, timeout_s=1.0)
    a = pool.acquire(5000)
    assert a.nbytes == 8192 and pool.bytes_in_use == 8192
    pool.release(a)
    assert pool.bytes_in_use == 0 and pool.bytes_allocated == 8192
    b = pool.acquire(6000)
    assert b is a  # same size class: the cached buffer comes back
    pool.release(b)


def test_at_the_cap_acquire_waits_for_a_release():
    pool = PinnedPool(16 << 10, timeout_s=10.0)
    held = [pool.acquire(8192), pool.acquire(8192)]
    got, started = [], threading.Event()

    def waiter():
        started.set()
        got.append(pool.acquire(8192))

    thread = threading.Thread(target=waiter)
    thread.start()
    started.wait()
    thread.join(0.05)
    assert thread.is_alive() and not got  # blocked at the cap
    pool.release(held.pop())
    thread.join(5.0)
    assert got and pool.bytes_in_use == 16 << 10 and pool.peak_bytes_allocated <= 16 << 10


def test_timeout_raises_the_typed_error_and_never_allocates_past_the_cap():
    pool = PinnedPool(16 << 10, timeout_s=0.02)
    a = pool.acquire(16 << 10)
    with pytest.raises(PinnedPoolExhausted) as info:
        pool.acquire(4096)
    assert info.value.cap == 16 << 10 and info.value.requested == 4096
    with pytest.raises(PinnedPoolExhausted):
        pool.acquire(1 << 20)  # larger than the cap: fails at once
    pool.release(a)
    small = pool.acquire(4096)  # the free 16 KiB buffer is evicted to make room
    assert pool.bytes_allocated == 4096
    pool.release(small)


def test_lazy_tensor_view_result_and_release():
    pool = PinnedPool(1 << 20)
    buf = pool.acquire(2 * 3 * 4)
    lazy = LazyTensor(pool, buf, (2, 3))
    assert lazy.ready()
    lazy.wait()[:] = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = lazy.result()
    assert out.tolist() == [[0, 1, 2], [3, 4, 5]] and pool.bytes_in_use == 0
    lazy.release()  # idempotent
    assert pool.bytes_in_use == 0
    with pytest.raises(LazyTensorReleased):
        lazy.wait()


def test_lazy_tensor_is_awaitable_and_released_on_gc(engine_for):
    engine = engine_for("bert")
    lazy = engine.step(Batch.from_sequences([[5, 6, 7], [8, 9]]))
    rows = asyncio.run(_await(lazy))
    assert rows.shape == (2, 64) and engine.stats()["pinned_bytes_in_use"] > 0
    del lazy, rows
    assert engine.stats()["pinned_bytes_in_use"] == 0


async def _await(lazy):
    return await lazy


def test_engine_steps_hold_the_cap_under_concurrency(tiny_models):
    from rose.engine import Engine

    cap = 16 << 10  # four 4 KiB outputs at a time
    engine = Engine.from_pretrained(tiny_models["bert"].path, device="cpu", pinned_cap_bytes=cap, pinned_timeout_s=20)
    seqs = random_seqs(tiny_models["bert"], [3, 5, 8, 2], seed=1)
    expected = engine.embed(seqs)
    peak = []

    def work(i):
        lazy = engine.step(Batch.from_sequences(seqs))
        peak.append(engine.runner.pool.bytes_in_use)
        rows = lazy.wait().copy()
        lazy.release()
        return rows

    with ThreadPoolExecutor(max_workers=12) as ex:
        results = list(ex.map(work, range(48)))
    assert max(peak) <= cap and engine.runner.pool.peak_bytes_allocated <= cap
    assert engine.stats()["pinned_bytes_in_use"] == 0
    for rows in results:
        assert np.allclose(rows / np.linalg.norm(rows, axis=1, keepdims=True), expected, atol=1e-5)
    stats = engine.stats()
    assert sum(stats["runs"].values()) >= 48 and stats["graphs_captured"] == 0
    engine.close()


def test_step_raises_when_the_cap_stays_full(tiny_models):
    from rose.engine import Engine

    engine = Engine.from_pretrained(tiny_models["bert"].path, device="cpu", pinned_cap_bytes=4096, pinned_timeout_s=0.05)
    held = engine.step(Batch.from_sequences([[5, 6]]))
    with pytest.raises(PinnedPoolExhausted):
        engine.step(Batch.from_sequences([[7, 8]]))
    held.release()
    assert engine.step(Batch.from_sequences([[7, 8]])).result().shape == (1, 64)
    engine.close()


class FlakyEvent:
    """A CUDA event whose query raises while `broken` (as every thread's does during a global-mode capture)."""

    def __init__(self):
        self.broken, self.done, self.queries = True, False, 0

    def query(self):
        self.queries += 1
        if self.broken:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return self.done


def test_a_release_survives_an_event_query_that_raises():
    pool = PinnedPool(1 << 20, pin=False)
    event = FlakyEvent()
    lazy = LazyTensor(pool, pool.acquire(4096), (1, 4), event)
    lazy.release()  # must not raise, and must not lose the buffer
    assert pool.stats()["bytes_in_use"] == 4096, "pending until its event is known to be done"
    event.broken, event.done = False, True
    assert pool.stats()["bytes_in_use"] == 0 and pool.acquire(4096) is not None


def test_lazy_tensor_gc_makes_no_cuda_call():
    pool = PinnedPool(1 << 20, pin=False)
    event = FlakyEvent()
    lazy = LazyTensor(pool, pool.acquire(4096), (1, 4), event)
    del lazy  # may run on any thread, the capturing one included
    assert event.queries == 0 and pool.bytes_in_use == 4096
    event.broken, event.done = False, True
    assert pool.stats()["bytes_in_use"] == 0


@pytest.mark.parametrize("capturing", [False, True])
def test_eviction_leaves_the_host_cache_alone_while_a_graph_is_captured(monkeypatch, capturing):
    """cudaFreeHost (torch's host emptyCache) synchronizes: while another lane's thread captures a graph it
    would invalidate that capture, so eviction only drops the pool's references then (rose.express)."""
    import torch

    import rose.graphs
    from rose.lazy import PinnedPool

    calls = []
    monkeypatch.setattr(torch._C, "_host_emptyCache", lambda: calls.append(1), raising=False)
    pool = PinnedPool(16384, pin=False)
    pool.release(pool.acquire(8192))  # a cached 8 KiB buffer
    monkeypatch.setattr(rose.graphs, "_capturing", 1 if capturing else 0)
    monkeypatch.setattr(pool, "pin", True)  # from here a pinning pool (this CPU allocates them unpinned)
    original_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: original_empty(*a, **k))
    pool.acquire(16384)  # over the cap with the cached buffer: it is evicted
    assert pool.stats()["bytes_allocated"] == 16384
    assert calls == ([] if capturing else [1])


def test_a_buffers_staging_views_are_made_once_and_alias_its_bytes():
    """PinnedBuffer.int64_views: the same numpy and torch views for the same byte range every step (made once),
    both over the buffer's own bytes; another range gets views of its own."""
    pool = PinnedPool(1 << 16, pin=False)
    buf = pool.acquire(4096)
    words, staged = buf.int64_views(64, 64 + 8 * 10)
    assert buf.int64_views(64, 64 + 8 * 10)[1] is staged
    words[:] = np.arange(10)
    assert staged.tolist() == list(range(10))
    assert buf.array[64:72].view(np.int64)[0] == 0 and buf.array[72:80].view(np.int64)[0] == 1
    other, _ = buf.int64_views(0, 16)
    assert other.shape == (2,) and not np.shares_memory(other, words)
    for end in range(24, 8 * 200, 8):  # exact-size eager batches: a range each, kept within the bound
        buf.int64_views(0, end)
        assert len(buf.words) <= VIEWS_KEPT


def test_a_buffers_copy_out_view_is_made_once_per_shape_over_its_bytes():
    """PinnedBuffer.float_rows: a step's [rows, dims] float32 target, the same tensor every step of that shape
    (each torch view a step gives up the GIL), over the buffer's first bytes, where the LazyTensor reads them."""
    pool = PinnedPool(1 << 16, pin=False)
    buf = pool.acquire(4096)
    rows = buf.float_rows(3, 4)
    assert buf.float_rows(3, 4) is rows and rows.shape == (3, 4)
    rows.copy_(torch.arange(12, dtype=torch.float32).view(3, 4))
    assert LazyTensor(pool, buf, (3, 4)).wait().tolist() == rows.tolist()
    assert buf.float_rows(2, 4) is not rows and buf.float_rows(2, 4).tolist() == rows[:2].tolist()
    for n in range(1, 200):  # many shapes: kept within the bound
        buf.float_rows(n, 4)
    assert len(buf.rows) <= VIEWS_KEPT


class CountingEvent:
    """A CUDA event that counts its calls (each gives up the GIL on a GPU) and is done after `done_after` queries."""

    def __init__(self, done_after: int = 0):
        self.queries = self.synchronizes = 0
        self.done_after = done_after

    def query(self):
        self.queries += 1
        return self.queries > self.done_after

    def synchronize(self):
        self.synchronizes += 1


def test_a_waited_lazy_tensor_makes_one_cuda_call_and_none_to_release():
    """wait() synchronizes once (no query first); the copy is then known done, so release() frees the buffer at
    once without asking the event again (the completer's CUDA calls a batch: 3 -> 1)."""
    pool = PinnedPool(1 << 20, pin=False)
    event = CountingEvent(done_after=5)
    lazy = LazyTensor(pool, pool.acquire(4096), (1, 4), event)
    lazy.wait()
    lazy.wait()
    assert (event.queries, event.synchronizes) == (0, 1)
    lazy.release()
    assert event.queries == 0 and pool.bytes_in_use == 0, "freed at once: its copy is done"


def test_an_unwaited_lazy_tensor_still_holds_its_buffer_until_the_event_passes():
    pool = PinnedPool(1 << 20, pin=False)
    event = CountingEvent(done_after=2)
    LazyTensor(pool, pool.acquire(4096), (1, 4), event).release()
    assert pool.stats()["bytes_in_use"] == 4096, "the copy may still be writing into it"
    assert pool.stats()["bytes_in_use"] == 0  # the event's next query says done
    seen = CountingEvent(done_after=0)
    ready = LazyTensor(pool, pool.acquire(4096), (1, 4), seen)
    assert ready.ready()
    ready.release()
    assert pool.bytes_in_use == 0, "ready() saw the copy done: released at once"
    assert seen.queries == 1, "ready()'s query only: the release asked the event nothing"


@pytest.mark.parametrize("mode, blocking", [("spin", False), ("block", True)])
def test_a_buffers_copy_event_waits_as_rose_copy_wait_says(monkeypatch, mode, blocking):
    """ROSE_COPY_WAIT: the copy-out's event spins (CUDA's default) or blocks (cudaEventBlockingSync) in wait();
    made once per buffer."""
    import rose.lazy

    made = []
    monkeypatch.setattr(rose.lazy, "COPY_WAIT", mode)
    monkeypatch.setattr(torch.cuda, "Event", lambda **kw: made.append(kw) or object())
    buf = PinnedPool(1 << 16, pin=False).acquire(4096)
    assert buf.done_event() is buf.done_event() and made == [{"blocking": blocking}]
