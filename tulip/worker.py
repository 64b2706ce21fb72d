"""The worker: drives the engine with up to two batches in flight, off the gRPC event loop.

Two threads, joined by a FIFO of launched batches:
- the launcher takes a free in-flight slot, waits until shortly before the running batch is expected to
  finish (tulip.pacing; `pack_ahead_s`), packs the next batch from the queue (tulip.scheduler's rule) and calls
  `engine.step(batch)`, which returns a LazyTensor at once on a GPU; so while batch n runs on the device,
  batch n+1 is packed late, with what arrived meanwhile, and queued behind it before n ends: the device
  never waits on host packing;
- the completer waits for the oldest LazyTensor, copies each sequence's rows to its request, releases the
  pinned buffer and the slot, then applies each finished request's output head and hands the bytes to the
  event loop (one call_soon_threadsafe per batch: see tulip.job.Handoff).
The event loop itself launches when that saves a thread hand-off (`launch_here`, after a push made with
wake=False): while nothing is in flight and the launcher is parked waiting for work, it takes the batch and
steps it on the loop, provided the engine says the batch replays a captured graph (`engine.replays`: a
fraction of a millisecond of host work; a batch that would run eagerly or capture goes to the launcher as
taken; so does a batch carrying bulk work while bulk is stepped by layers, which holds its caller for the whole
batch). A lone request then costs the hand-offs loop -> completer -> loop instead of loop -> launcher ->
completer -> loop, and its batch reaches the device without waiting for the launcher to wake and take the
GIL. Only while traffic is sequential (the last batch carried one request): under concurrent load the
first arrival after an idle moment would otherwise leave alone in a batch of its own, the next ones in a
second, and the device would run small batches (H200, 16 closed-loop clients straight to Tulip: -7 %
requests/s); there the launcher's wake-up gathers them, and everything goes through it as before. For the
same reason a launcher woken while an inline batch runs paces first (REHOLD: holds until shortly before
that batch ends) and takes what arrived meanwhile as one batch behind it.
Only the completer touches Job state, so a Job needs no lock. Engine errors fail only that batch's jobs,
and drop those jobs' sequences still queued. Once the device is known lost (tulip.device_check) nothing more is
launched: what waits is answered DeviceLost at once, unpacked, and so is a batch taken but not yet launched (a
launch that raised keeps its slot until the completer has probed the device). The completer's half is
tulip.completer; this module is the launcher's.
"""

from __future__ import annotations

import logging
import queue as stdlib_queue
import threading
import time

from tulip.completer import STOP, Completer
from tulip.device_check import DeviceCheck
from tulip.errors import DeadlineExpired, TulipError
from tulip.pacing import BusySpans, DeviceClock, DeviceTimes
from tulip.packing import FailedBatch, Launched, build_batch, jobs_of
from tulip.scheduler import BULK, EXPRESS, MAIN, REHOLD, PackedBatch, SequenceQueue

log = logging.getLogger("tulip.worker")


class Worker(Completer):
    express = False  # tulip.express.ExpressWorker: takes interactive requests while bulk work is about
    express_lane = False  # ... and steps them on ROSE's express lane (False: on the main lane, between bulk's layers)
    name = "tulip"

    def __init__(self, engine, queue: SequenceQueue, *, max_inflight: int = 2, metrics=None,
                 idle_capture_s: float = 0.0, pack_ahead_s: float = 0.0, inline_launch: bool = False,
                 heartbeat=None, layers_ahead: int = 0, busy_spans: BusySpans | None = None,
                 device_check: DeviceCheck | None = None) -> None:
        """layers_ahead: batches with bulk work are stepped one decoder layer at a time with at most this many
        layers on the device ahead of the launcher (engine.step_layered), so the express worker's interactive
        batches run between two of them; 0 = whole steps. busy_spans: the device's busy time shared with the
        other worker (tulip.pacing.BusySpans). device_check: whether a failed batch left the device able to run
        work, shared with the other worker (tulip.device_check)."""
        self.engine = engine
        self.device_check = device_check or DeviceCheck(engine)
        self.layers_ahead = layers_ahead
        self._layer_steps = int(getattr(engine, "layer_steps", 0) or 0) if layers_ahead > 0 else 0
        self.heartbeat = heartbeat  # protos.heartbeat.Heartbeat: counts launched batches for `ivy up`; None = off
        self.queue = queue
        self.max_inflight = max_inflight
        self.metrics = metrics
        self.idle_capture_s = idle_capture_s  # 0 = off; see _next_batch
        self.idle_captures = 0
        self.pack_ahead_s = pack_ahead_s  # 0 = pack as soon as a slot frees; see tulip.pacing
        budget = queue.max_batch_tokens if queue is not None else None  # admission's bound needs it (tulip.pacing)
        self.device_times = DeviceTimes(max_batch_tokens=budget)
        self._clock = DeviceClock(busy_spans)  # the batches in flight, under _count_lock
        self._stepping_since = 0.0  # monotonic time the launcher entered engine.step(); 0 = not inside it
        self.held_launches = 0
        self._holding = False  # the launcher waits in queue.hold() for a delivery: poke it
        info = engine.info
        self._native_int8 = bool(info.native_int8)
        self._default_normalize = bool(info.normalize_default)
        self._slots = threading.Semaphore(max_inflight)
        self._launched: stdlib_queue.SimpleQueue = stdlib_queue.SimpleQueue()
        self._inflight = 0  # launched, not yet delivered (read by metrics; written under _count_lock)
        self._count_lock = threading.Lock()
        self.batches_launched = 0
        replays = getattr(engine, "replays", None)
        # Inline launches need the engine's word that a batch replays, and no idle capture: a launcher that
        # just timed out of its wait may be about to capture, which the loop's step would then wait behind.
        self._replays = replays if inline_launch and callable(replays) and idle_capture_s <= 0 else None
        self.inline_launches = 0
        self._last_requests = 0  # requests in the last batch launched: inline only after a batch of <= 1
        self._inline_running = False  # an inline batch was launched and the launcher has not paced since
        self._threads = [threading.Thread(target=self._launch_loop, name=f"{self.name}-launcher", daemon=True),
                         threading.Thread(target=self._complete_loop, name=f"{self.name}-completer", daemon=True)]

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def device_busy_s(self) -> float:
        """Seconds with a batch on the device (tulip_device_busy_seconds_total)."""
        return self._clock.busy_s

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Close the queue, let queued work finish, join. True when both threads exited in time."""
        self.queue.close()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    # -- launcher -------------------------------------------------------------------------------

    @property
    def inline(self) -> bool:
        """Whether pushes should be made with wake=False and followed by launch_here()."""
        return self._replays is not None

    def _launch_loop(self) -> None:
        while True:
            self._slots.acquire()
            self._hold_until_late()
            if self.device_check.lost is not None:
                self._fail_waiting()
            packed = self._next_batch()
            if packed is None:  # closed and drained
                self._launched.put(STOP)
                return
            self._run(packed)

    def launch_here(self) -> bool:
        """On the event loop, right after a push made with wake=False (module docstring): take the batch and
        launch it here when nothing is in flight, the launcher is parked and the batch replays a captured
        graph; else the launcher gets it (woken, or handed the batch as taken). True when launched here."""
        if (self._inflight or self._last_requests > 1 or self.device_check.lost is not None
                or not self._slots.acquire(blocking=False)):
            self.queue.wake()
            return False
        packed = self.queue.take_parked()
        if packed is None:  # the launcher was not parked (it is woken), or there is nothing of MAIN's
            self._slots.release()
            return False
        try:
            built = build_batch(packed.sequences) if packed.sequences else None
            # a batch stepped by layers holds its caller for the whole batch: never the loop
            here = not (self._layer_steps and packed.lane_tokens[BULK]) and (
                built is None or bool(self._replays(built[0])))
        except Exception:  # noqa: BLE001 - whatever went wrong, the launcher runs it as usual
            log.exception("inline launch check failed; the launcher runs the batch")
            built, here = None, False
        if not here:
            self._slots.release()
            self.queue.hand_over(packed)
            return False
        self.inline_launches += 1
        self._run(packed, built, inline=True)
        return True

    def _run(self, packed: PackedBatch, built=None, inline: bool = False) -> None:
        """Launch a taken batch whose in-flight slot is held (the launcher's or launch_here's): fail its
        expired tickets, step its sequences; the slot is released when nothing reaches the device."""
        if self.metrics is not None:
            try:  # nothing here may lose a taken batch (launch_here has no launcher to fall back on)
                self.metrics.observe_skipped(packed.skipped)
            except Exception:  # noqa: BLE001
                log.debug("metrics failed", exc_info=True)
        if packed.expired:
            self._launched.put(FailedBatch(packed.expired, DeadlineExpired(
                "deadline exceeded while queued; the request never reached the engine")))
        if packed.sequences and self.device_check.lost is not None:  # nothing more is launched onto a dead device
            self._fail_unlaunched(packed, self.device_check.error())
            return
        if not packed.sequences:
            self._slots.release()
            return
        try:
            self._launch(packed, built, inline)
        except Exception as exc:  # a failing batch must not take the replica down
            log.exception("engine.step failed on a batch of %d sequences / %d tokens",
                          len(packed.sequences), packed.tokens)
            self._fail_unlaunched(packed, exc)  # the completer maps exc (and probes the device, never here)

    def _fail_unlaunched(self, packed: PackedBatch, error: BaseException) -> None:
        """A taken batch that never reached the device (its launch raised, or the device is lost): its requests
        fail on the completer with `error`, their other sequences leave the queue. Its slot frees here when the
        error is known (a TulipError), else on the completer after it probed the device, so that no batch is
        launched while the probe asks whether the device still runs."""
        jobs = jobs_of(packed.sequences)
        for job in jobs:  # before the slot frees: the next batch must not take their other sequences
            self.queue.cancel(job)
        if packed.lane_tokens[BULK]:
            self.queue.bulk_done()  # it never reached the device
        known = isinstance(error, TulipError)
        self._launched.put(FailedBatch(jobs, error, slot=not known))
        if known:
            self._slots.release()

    def _fail_waiting(self) -> None:
        """The device is lost (tulip.device_check): every request waiting for this worker is answered DeviceLost at
        once, on its completer, none packed or launched (RELIABILITY 62)."""
        dropped = self.queue.drop_waiting(EXPRESS if self.express else MAIN)
        if dropped:
            self._launched.put(FailedBatch(dropped, self.device_check.error()))

    def _hold_until_late(self) -> None:
        """With a batch on the device, wait until shortly before it is expected to finish (tulip.pacing)."""
        if self.pack_ahead_s <= 0 or self.device_check.lost is not None:
            return
        with self._count_lock:
            if not self._inflight:
                return
            until = self._clock.tail_end - self.pack_ahead_s
        start = time.monotonic()
        if until > start:
            self.held_launches += 1
            self._holding = True  # set before hold() checks its stop condition under the queue's lock
            self.queue.hold(until, lambda: self._inflight == 0)
            self._holding = False
            if self.metrics is not None:
                self.metrics.observe_hold(time.monotonic() - start)

    def _next_batch(self) -> PackedBatch | None:
        """The next batch. With idle capture on, each time the queue stays empty for idle_capture_s
        while nothing is in flight (the device is idle), the engine captures one graph layout that ran
        eagerly but has no graph yet, so the layout's next batch replays instead of capturing on the
        request path. A request that arrives meanwhile waits for that one capture."""
        capture = getattr(self.engine, "capture_pending", None)
        while self.idle_capture_s > 0 and capture is not None and self.device_check.lost is None:
            packed = self.queue.next_batch(timeout=self.idle_capture_s)
            if packed is not None or self.queue.closed:
                return packed
            if self._inflight:
                continue
            if self.device_check.lost is not None:  # lost while this worker waited: nothing more on the device
                break
            try:
                captured = capture()
            except Exception:  # it would fail again at every idle moment: stop trying, keep serving
                log.exception("idle graph capture failed; idle capture is off from now on")
                self.idle_capture_s = 0.0
                break
            if not captured:
                break  # nothing pending until an eager batch runs; the loop comes back here after it
            self.idle_captures += 1
            if self.metrics is not None:
                self.metrics.observe_idle_capture()
        while (packed := self.queue.next_batch(rehold=self._rehold)) is REHOLD:
            self._inline_running = False
            self._hold_until_late()
        return packed

    def _rehold(self) -> bool:
        """Woken while the loop's inline batch runs: pace (hold until late) before taking, so what arrives
        during that batch leaves in one batch behind it, not the first arrival alone and the rest after."""
        return self._inline_running and self._inflight > 0 and self.pack_ahead_s > 0

    def _launch(self, packed: PackedBatch, built=None, inline: bool = False) -> None:
        batch, row_starts = built or build_batch(packed.sequences)
        self._last_requests = _requests_in(packed.sequences)
        self._inline_running = inline  # a launcher batch since: REHOLD is for an inline one only
        layered = bool(self._layer_steps and packed.lane_tokens[BULK])
        t0 = time.perf_counter()
        self._stepping_since = began = time.monotonic()
        try:
            if layered:
                lazy = self.engine.step_layered(batch, self.layers_ahead)
            else:
                lazy = self.engine.step(batch, express=True) if self.express_lane else self.engine.step(batch)
        finally:
            self._stepping_since = 0.0
        t1 = time.perf_counter()
        now = time.monotonic()
        estimate = self.device_times.estimate(packed.tokens) or 0.0
        # A layered batch returns with only its last `layers_ahead` layers still to run: that is what is left of
        # it on the device, and it has been on the device since the stepping began.
        left = estimate * min(1.0, self.layers_ahead / self._layer_steps) if layered else None
        with self._count_lock:
            self._inflight += 1
            self.batches_launched += 1
            self._clock.launched(now, estimate, began if layered else None, left)
        self._launched.put(Launched(packed, row_starts, lazy, t0, began if layered else now))
        if self.heartbeat is not None:
            try:  # launched already: nothing after the put may fail the batch
                self.heartbeat.beat()
            except Exception:  # noqa: BLE001
                log.debug("batch counter failed", exc_info=True)
        if self.metrics is not None:
            try:
                self.metrics.observe_launch(packed, batch, t1 - t0, lazy, express=self.express, inline=inline)
            except Exception:
                log.debug("metrics failed", exc_info=True)

    def on_device(self) -> tuple[float, float] | None:
        """(since when, expected device seconds) of the oldest batch in flight, None when there is none
        (tulip.pacing.DeviceClock)."""
        with self._count_lock:
            return self._clock.oldest()

    @property
    def stepping_since(self) -> float:
        """When the launcher entered engine.step() (monotonic), 0 when it is not inside it."""
        return self._stepping_since


def _requests_in(sequences: list) -> int:
    """How many requests the sequences belong to, counted up to 2 (all that launch_here asks)."""
    first = sequences[0].ticket if sequences else None
    return 2 if any(s.ticket is not first for s in sequences) else int(first is not None)
