"""Page-locked host buffers with a byte cap (PinnedPool) and the result handle of a step (LazyTensor).

Why pinned: a device-to-host copy is only asynchronous into page-locked memory, and the async copy is
what lets the caller pack batch n+1 while the GPU still works on batch n. Why a cap: pinned memory is
taken from the OS and cannot be swapped, so an unbounded pool under a burst would starve the host.
At the cap, `acquire()` waits for a release (backpressure) and raises `PinnedPoolExhausted` after the
timeout; it never allocates past the cap. Buffers come in power-of-two size classes (torch's own host
allocator rounds the same way) and are reused through per-class free lists.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from rose.graphs import capturing

MIN_CLASS_BYTES = 4096
VIEWS_KEPT = 64  # staging ranges a buffer keeps views of (PinnedBuffer.int64_views), ~0.5 KB each
# How wait() waits for a step's copy out: "spin" (CUDA's default: the waiting thread polls, a core busy) or "block"
# (cudaEventBlockingSync: it sleeps until the driver wakes it, freeing the core and the driver for the launcher).
COPY_WAIT = os.environ.get("ROSE_COPY_WAIT", "spin").strip().lower()
if COPY_WAIT not in ("spin", "block"):
    raise ValueError(f"ROSE_COPY_WAIT must be spin or block, got {COPY_WAIT!r}")


class PinnedPoolExhausted(RuntimeError):
    """No pinned buffer of the requested size could be had within the timeout (or ever, if above the cap)."""

    def __init__(self, requested: int, cap: int, in_use: int, timeout_s: float) -> None:
        self.requested, self.cap, self.in_use, self.timeout_s = requested, cap, in_use, timeout_s
        super().__init__(
            f"pinned pool exhausted: need {requested} bytes, cap {cap} bytes, {in_use} bytes in use, "
            f"waited {timeout_s:.3f} s")


class LazyTensorReleased(RuntimeError):
    """The LazyTensor's buffer went back to the pool; its data is gone."""


def size_class(nbytes: int) -> int:
    """The power of two (at least 4 KiB) that a request of `nbytes` is served from."""
    return max(MIN_CLASS_BYTES, 1 << max(0, int(nbytes) - 1).bit_length())


@dataclass(eq=False)
class PinnedBuffer:
    tensor: torch.Tensor  # uint8 [nbytes], pinned when the pool pins
    nbytes: int  # the size class, what counts against the cap
    array: np.ndarray = field(init=False, repr=False)  # the same bytes as numpy, made once (steps go through it)
    event: Any = None  # the CUDA event a step records after its copy out; recorded again by the buffer's next
    # step, which can only have it once the pool saw this one complete (release(after=event))

    words: dict = field(default_factory=dict, repr=False)  # (start, end) byte range -> (numpy, torch) int64 views
    rows: dict = field(default_factory=dict, repr=False)  # (rows, dims) -> the float32 [rows, dims] copy-out view

    def __post_init__(self) -> None:
        self.array = self.tensor.numpy()

    def int64_views(self, start: int, end: int) -> tuple[np.ndarray, torch.Tensor]:
        """Bytes [start, end) as int64, numpy and torch: a step's staging area, made once per range (four slices
        and views every step before: ~3 of the 4.3 us its staging took on the CPU VM)."""
        return _kept(self.words, (start, end), lambda: (self.array[start:end].view(np.int64),
                                                        self.tensor[start:end].view(torch.int64)))

    def float_rows(self, rows: int, dims: int) -> torch.Tensor:
        """The buffer's first rows * dims float32 as [rows, dims], where a step copies its rows out: made once per
        shape. Every torch call releases the GIL and takes it back (three views a step before); beside a thread
        running Python each take-back waits for that thread to let go (benchmarks/NOTES.md, "GIL take-backs")."""
        return _kept(self.rows, (rows, dims),
                     lambda: self.tensor[: rows * dims * 4].view(torch.float32).view(rows, dims))

    def done_event(self) -> Any:
        """This buffer's CUDA event, created at its first step."""
        if self.event is None:
            self.event = torch.cuda.Event(blocking=COPY_WAIT == "block")
        return self.event


def _kept(views: dict, key: tuple, make: Callable[[], Any]) -> Any:
    """views[key], made by make() the first time; past VIEWS_KEPT keys the dict starts again (exact-size eager
    batches make a key each: a bound for a long life)."""
    view = views.get(key)
    if view is None:
        if len(views) >= VIEWS_KEPT:
            views.clear()
        view = views[key] = make()
    return view


class PinnedPool:
    """A byte-capped pool of (optionally page-locked) host buffers; thread-safe."""

    def __init__(self, cap_bytes: int, timeout_s: float = 30.0, pin: bool | None = None) -> None:
        if cap_bytes < MIN_CLASS_BYTES:
            raise ValueError(f"pinned_cap_bytes must be at least {MIN_CLASS_BYTES}, got {cap_bytes}")
        self.cap_bytes = int(cap_bytes)
        self.timeout_s = float(timeout_s)
        self.pin = torch.cuda.is_available() if pin is None else pin
        self._cond = threading.Condition()
        self._free: dict[int, list[PinnedBuffer]] = defaultdict(list)
        self._pending: list[tuple[PinnedBuffer, Any]] = []  # released, waiting for their event
        self.bytes_in_use = 0  # handed out and not yet back (pending releases count)
        self.bytes_allocated = 0  # in use + cached free buffers; never above cap_bytes
        self.peak_bytes_allocated = 0

    def acquire(self, nbytes: int, timeout_s: float | None = None) -> PinnedBuffer:
        """A buffer of at least `nbytes`; waits while the pool is at its cap, then raises."""
        size = size_class(nbytes)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if size > self.cap_bytes:
            raise PinnedPoolExhausted(size, self.cap_bytes, self.bytes_in_use, 0.0)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                self._reclaim_locked()
                free = self._free[size]
                if free:
                    buf = free.pop()
                    self.bytes_in_use += size
                    return buf
                over = self.bytes_allocated + size - self.cap_bytes
                if over > 0 and self.bytes_in_use + size <= self.cap_bytes:
                    self._evict_locked(over)  # cached buffers of other sizes make room
                if self.bytes_allocated + size <= self.cap_bytes:
                    self.bytes_allocated += size  # reserve; allocate outside the lock
                    self.bytes_in_use += size
                    self.peak_bytes_allocated = max(self.peak_bytes_allocated, self.bytes_allocated)
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PinnedPoolExhausted(size, self.cap_bytes, self.bytes_in_use, timeout)
                # Pending releases complete without a notify (a GPU event), so poll them briefly.
                self._cond.wait(min(remaining, 0.001) if self._pending else remaining)
        try:
            tensor = torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)
        except BaseException:
            with self._cond:
                self.bytes_allocated -= size
                self.bytes_in_use -= size
                self._cond.notify_all()
            raise
        return PinnedBuffer(tensor=tensor, nbytes=size)

    def release(self, buf: PinnedBuffer, after: Any = None, poll: bool = True) -> None:
        """Give `buf` back; with `after` (a CUDA event), only once that event has completed. Never raises
        for the event: one whose query fails counts as not done yet. poll=False: no CUDA call at all (the
        buffer waits in the pending list for the next acquire or stats to poll it)."""
        with self._cond:
            if after is not None and not (poll and _done(after)):
                self._pending.append((buf, after))
                return
            self._free[buf.nbytes].append(buf)
            self.bytes_in_use -= buf.nbytes
            self._cond.notify_all()

    def stats(self) -> dict[str, int]:
        with self._cond:
            self._reclaim_locked()
            return {"bytes_in_use": self.bytes_in_use, "bytes_allocated": self.bytes_allocated,
                    "peak_bytes_allocated": self.peak_bytes_allocated, "cap_bytes": self.cap_bytes}

    def _reclaim_locked(self) -> None:
        if not self._pending:
            return
        still = []
        for buf, event in self._pending:
            if _done(event):
                self._free[buf.nbytes].append(buf)
                self.bytes_in_use -= buf.nbytes
            else:
                still.append((buf, event))
        self._pending = still

    def _evict_locked(self, need: int) -> None:
        """Drop cached free buffers of other sizes until `need` bytes are freed (or none are left)."""
        freed = 0
        for size in sorted(self._free, reverse=True):
            bucket = self._free[size]
            while bucket and freed < need:
                bucket.pop()
                self.bytes_allocated -= size
                freed += size
        if freed and self.pin and hasattr(torch._C, "_host_emptyCache") and not capturing():
            torch._C._host_emptyCache()  # hand the dropped blocks back instead of keeping them cached (not
            # while another lane's thread captures a graph: cudaFreeHost synchronizes; torch keeps them till later)


def _done(event: Any) -> bool:
    """Whether a CUDA event has completed; False when the query itself fails (e.g. a capture in the
    default global mode forbids it on every thread): the buffer then waits for a later poll."""
    try:
        return bool(event.query())
    except Exception:  # noqa: BLE001
        return False


class LazyTensor:
    """The result of `Engine.step()`: a host buffer that a non-blocking device-to-host copy fills.

    `ready()` polls the CUDA event recorded after the copy; `wait()` blocks on it and returns a numpy view
    (valid until `release()`); `result()` copies and releases; `await lazy` polls without blocking the
    event loop. On a CPU the data is complete when the LazyTensor is returned.
    """

    def __init__(self, pool: PinnedPool | None, buffer: PinnedBuffer | None, shape: tuple[int, ...],
                 event: Any = None, offset: int = 0) -> None:
        self._pool, self._buffer, self._event = pool, buffer, event
        self.shape = tuple(int(s) for s in shape)
        self._offset = offset
        self.padded_tokens: int | None = None  # tokens the device ran (the bucket), set by the runner
        self._lock = threading.Lock()
        self._released = False
        self._complete = event is None  # the copy is known done: release() then makes no CUDA call (the GIL's)
        nbytes = int(np.prod(self.shape, dtype=np.int64)) * 4
        if buffer is None:
            self._array = np.zeros(self.shape, dtype=np.float32)
        else:
            raw = buffer.array[offset: offset + nbytes]
            self._array = raw.view(np.float32).reshape(self.shape)

    @property
    def nbytes(self) -> int:
        return int(self._array.nbytes)

    def ready(self) -> bool:
        if not (self._released or self._complete):
            self._complete = bool(self._event.query())
        return self._released or self._complete

    def wait(self, timeout: float | None = None) -> np.ndarray:
        """Block until the copy is complete; a float32 numpy view of the rows, valid until release()."""
        if self._released:
            raise LazyTensorReleased("LazyTensor was released")
        if not self._complete:  # one CUDA call when no timeout: each gives up the GIL (PinnedBuffer.float_rows)
            if timeout is None:
                self._event.synchronize()
            else:
                deadline = time.monotonic() + timeout
                while not self._event.query():
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"LazyTensor not ready after {timeout} s")
                    time.sleep(0.0002)
            self._complete = True
        return self._array

    def result(self, timeout: float | None = None) -> np.ndarray:
        """A copy of the rows; releases the buffer."""
        out = np.array(self.wait(timeout), copy=True)
        self.release()
        return out

    def release(self, poll: bool = True) -> None:
        """Give the buffer back to the pool (idempotent). Safe before the copy completes: the pool
        reuses the buffer only once the event has passed."""
        with self._lock:
            if self._released:
                return
            self._released = True
        if self._pool is not None and self._buffer is not None:
            self._pool.release(self._buffer, after=None if self._complete else self._event, poll=poll)
        self._buffer = None
        self._array = None  # type: ignore[assignment]

    def __await__(self):
        return self._await_ready().__await__()

    async def _await_ready(self) -> np.ndarray:
        delay = 0.0
        while not self.ready():
            await asyncio.sleep(delay)
            delay = min(0.001, delay * 2 if delay else 0.00005)
        return self.wait()

    def __del__(self) -> None:
        try:  # no CUDA call here: __del__ runs on whatever thread drops the last reference, mid-capture too
            self.release(poll=False)
        except Exception:  # interpreter shutdown: the pool may be gone already
            pass

    def __repr__(self) -> str:
        state = "released" if self._released else ("ready" if self.ready() else "pending")
        return f"LazyTensor(shape={self.shape}, {state})"
