"""Tulip's gRPC server (grpc.aio): Embed, Info and grpc.health.v1 over one FCFS queue and one worker.

Life cycle: bind and report NOT_SERVING -> load the model, warm up, verify -> SERVING -> on SIGTERM:
NOT_SERVING at once, new Embed calls refused with UNAVAILABLE, every accepted call answered, then stop
(bounded by shutdown_timeout_s). The event loop only validates, enqueues and awaits futures; packing and
engine work run on the worker's threads. Admission (`admit`, `settled`, `rejected`) lives here; the RPCs
are tulip.servicer's (unary) and tulip.stream's (EmbedStream); the channel options tulip.channel_options'
(CLIENT_CHANNEL_OPTIONS and server_options are re-exported from here).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from protos import embed_pb2
from protos.framing import PORT_OFFSET as FRAMED_PORT_OFFSET
from protos.heartbeat import Heartbeat
from rose import gc_pauses
from tulip.channel_options import CLIENT_CHANNEL_OPTIONS, server_options
from tulip.config import TulipConfig
from tulip.engine_loader import build_engine, probe_full_budget, run_in_daemon_thread, vocab_size
from tulip.device_check import DeviceCheck
from tulip.errors import (DeadlineExpired, DeadlineUnmeetable, InvalidRequest, NotReady, QueueFull, ShuttingDown,
                          Stalled, TulipError)
from tulip.job import Job
from tulip.lanes import check_deadline, lane_of
from tulip.metrics import TulipMetrics
from tulip.pacing import BusySpans
from tulip.request import RequestLimits, parse_embed_request
from tulip.scheduler import INTERACTIVE, SequenceQueue
from tulip.servicer import SERVICE_NAME, TulipEmbedderServicer, add_embedder
from tulip.decoding import UndecodableRequest
from tulip.watchdog import Watchdog
from tulip.express import ExpressWorker
from tulip.framed_listener import FramedListener
from tulip.worker import Worker

__all__ = ["CLIENT_CHANNEL_OPTIONS", "SERVICE_NAME", "TulipServer", "server_options"]

log = logging.getLogger("tulip.server")

class TulipServer:
    def __init__(self, config: TulipConfig, engine: Any = None, metrics: TulipMetrics | None = None) -> None:
        self.config = config
        self.engine = engine
        self.metrics = metrics or TulipMetrics()
        self.health = health_aio.HealthServicer()
        self.ready = False
        self.draining = False
        self.port: int | None = None
        self.queue: SequenceQueue | None = None
        self.worker: Worker | None = None
        self.express: ExpressWorker | None = None  # tulip.express, when on and the engine has an express lane
        self.watchdog: Watchdog | None = None
        self.device_check: DeviceCheck | None = None  # made with the workers (tulip.device_check)
        self.lost_device = asyncio.Event()  # set once the device runs no work: `tulip serve` drains and exits 3
        self._watchdog_task: asyncio.Task | None = None
        self.limits: RequestLimits | None = None
        self.batch_tokens = 0  # the effective token budget, known once the engine's device is
        self._grpc: grpc.aio.Server | None = None
        self.framed = FramedListener(self)  # tulip.framed_listener: bound only with config.framed_port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._active = 0  # accepted Embed calls not yet answered
        self.calls_seen = 0  # Embed calls and stream requests that reached admit(), refused ones too
        self._idle: asyncio.Event | None = None
        # Observed at once: Tulip's registry is not in multiprocess mode, its values' locks are each their own
        # and held over no allocation, so a collection cannot interrupt one of them (rose/gc_pauses.py).
        self.gc_timer = gc_pauses.PauseTimer(self.metrics.observe_gc_pause)
        self._frozen = False
        self.busy_spans = BusySpans()  # the device's busy seconds over both workers' batches
        self.metrics.bind_state(
            queue_depth=lambda: self.queue.depth() if self.queue else (0, 0),
            lane_depth=lambda lane: self.queue.lane_tokens(lane) if self.queue else 0,
            inflight=lambda: sum(w.inflight for w in (self.worker, self.express) if w is not None),
            device_busy=self.busy_spans.total,
            ready=lambda: self.ready and not self.stalled and self.device_lost is None,
            engine_stats=self._engine_stats)

    def _engine_stats(self) -> dict:
        stats = getattr(self.engine, "stats", None)
        return stats() if callable(stats) else {}

    async def start(self) -> None:
        await self.start_listening()
        await self.load()

    async def start_listening(self) -> None:
        """Bind and answer health NOT_SERVING while the model loads (probes see a live process)."""
        self._loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        server = grpc.aio.server(options=server_options(self.config))
        add_embedder(TulipEmbedderServicer(self), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        address = f"{self.config.host}:{self.config.port}"
        self.port = server.add_insecure_port(address)  # raises RuntimeError when the port is taken
        await server.start()
        self._grpc = server
        await self._start_framed()
        self.gc_timer.install()
        self.metrics.serve(self.config.metrics_host, self.config.metrics_port)
        log.info("tulip listening on %s:%d", self.config.host, self.port)

    async def _start_framed(self) -> None:
        """The framed EmbedStream (tulip/framed.py) on config.framed_port; by default (-1) on the gRPC port +
        200, or an ephemeral port beside an ephemeral gRPC port, and skipped with a warning when that is taken
        (Ivy then stays on the gRPC stream). A port set explicitly must bind."""
        port = self.config.framed_port
        if port == 0:
            return
        auto = port == -1
        if auto:
            port = self.port + FRAMED_PORT_OFFSET if self.config.port else 0
            if port > 65535:
                log.warning("no framed stream: gRPC port %d + %d is past 65535", self.port, FRAMED_PORT_OFFSET)
                return
        try:
            await self.framed.start(self.config.host, port)
        except OSError as exc:  # the CLI's "cannot listen" names the gRPC port: say which one failed
            if not auto:
                raise OSError(f"framed port {port}: {exc}") from exc
            log.warning("no framed stream: port %d: %s (TULIP_FRAMED_PORT to choose one, 0 for none)", port, exc)
            return
        log.info("tulip framed stream on %s:%d", self.config.host, self.framed.port)

    async def load(self) -> None:
        """Load (unless an engine was given), warm up, probe the full budget, start the worker, SERVING."""
        config = self.config
        folder = config.model
        if self.engine is None:
            self.engine, folder = await run_in_daemon_thread(build_engine, config)
        info = self.engine.info
        vocab = vocab_size(self.engine, folder)
        self.batch_tokens = config.batch_tokens_for(str(info.device))
        self.limits = RequestLimits(max_length=int(info.max_length), dimensions=int(info.dimensions),
                                    pooling=info.pooling, vocab_size=vocab,
                                    max_response_bytes=config.max_message_bytes,
                                    type_vocab_size=int(getattr(info, "type_vocab_size", 1)),
                                    outputs=tuple(getattr(info, "outputs", ())))
        if config.probe_full_batch_on(str(info.device)):
            await run_in_daemon_thread(probe_full_budget, self.engine, self.batch_tokens,
                                       config.max_batch_seqs, int(info.max_length), vocab)
        queue_tokens = max(config.max_queue_tokens, self.batch_tokens)
        self.queue = SequenceQueue(self.batch_tokens, config.max_batch_seqs, queue_tokens, share=config.request_share,
                                   bulk_share=config.bulk_share,
                                   interactive_batch_tokens=config.interactive_batch_tokens,
                                   interactive_recent_s=config.interactive_recent_ms / 1e3)
        heartbeat = _heartbeat(config.activity_file, str(info.device))
        self.device_check = DeviceCheck(self.engine, on_lost=self._device_lost_from_thread)
        layered = config.bulk_layers_ahead if config.bulk_by_layers and getattr(self.engine, "layer_steps", 0) else 0
        self.worker = Worker(self.engine, self.queue, max_inflight=config.max_inflight_batches,
                             metrics=self.metrics, idle_capture_s=config.idle_capture_ms / 1e3,
                             pack_ahead_s=config.pack_ahead_ms / 1e3, inline_launch=config.inline_launch,
                             heartbeat=heartbeat, layers_ahead=layered, busy_spans=self.busy_spans,
                             device_check=self.device_check)
        self.worker.start()
        if config.express_batch_tokens and config.lanes and (layered or getattr(self.engine, "express", False)):
            express_tokens = min(config.express_batch_tokens, self.batch_tokens)  # the engine is sized by the budget
            self.express = ExpressWorker(self.engine, self.queue, express_tokens=express_tokens,
                                         metrics=self.metrics, main_lane=bool(layered), busy_spans=self.busy_spans,
                                         device_check=self.device_check)
            self.express.heartbeat = heartbeat
            self.express.start()  # prewarms its lane's graphs, then turns express on (tulip/express.py)
        if config.watchdog_s > 0:
            self.watchdog = Watchdog(self.worker, floor_s=config.watchdog_s, factor=config.watchdog_factor,
                                     on_change=self._on_stall, others=(self.express,) if self.express else ())
            self._watchdog_task = asyncio.ensure_future(self.watchdog.run())
        if config.gc_freeze:  # the loaded, warmed heap out of every later collection (rose/gc_pauses.py)
            log.info("garbage collector: %d start-up objects frozen", gc_pauses.freeze())
            self._frozen = True
        self.ready = True
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("tulip ready: model %s (%s, %d dims, max_length %d) on %s, attention %s, "
                 "max_batch_tokens %d", self.model_id, info.family, info.dimensions, info.max_length,
                 info.device, getattr(info, "attention_backend", "?"), self.batch_tokens)

    @property
    def device_lost(self) -> str | None:
        """What failed, once a batch left the device unable to run work (tulip.device_check); else None."""
        return self.device_check.lost if self.device_check is not None else None

    def _device_lost_from_thread(self, detail: str) -> None:
        """DeviceCheck's on_lost, on a worker's thread (or the loop's, for an inline launch): on the loop, health
        NOT_SERVING and the event `tulip serve` waits on beside SIGTERM (it drains, then exits with status 3)."""
        self._loop.call_soon_threadsafe(self._on_device_lost)

    def _on_device_lost(self) -> None:
        self.ready = False
        self.lost_device.set()
        for service in ("", SERVICE_NAME):
            asyncio.ensure_future(self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING))

    @property
    def stalled(self) -> bool:
        return self.watchdog is not None and self.watchdog.stalled

    async def _on_stall(self, stalled: bool) -> None:
        """The watchdog's verdict (tulip.watchdog) as health; a draining replica, or one whose device was lost, stays
        NOT_SERVING."""
        if self.draining or self.device_lost is not None:
            return
        status = health_pb2.HealthCheckResponse.NOT_SERVING if stalled else health_pb2.HealthCheckResponse.SERVING
        for service in ("", SERVICE_NAME):
            await self.health.set(service, status)

    @property
    def model_id(self) -> str:
        return self.config.served_model_name or (self.engine.info.model_id if self.engine else "")

    async def drain(self) -> bool:
        """Graceful shutdown: NOT_SERVING, refuse new work, answer everything accepted, stop.
        True when all accepted work was answered within shutdown_timeout_s."""
        deadline = time.monotonic() + self.config.shutdown_timeout_s
        # the gRPC server's own stop after the work: 0.5 s, or a quarter of a shorter timeout (a fixed 0.5 s left
        # a timeout of 0.5 s or less nothing for the work)
        stop_s = min(0.5, self.config.shutdown_timeout_s / 4)
        self.draining = True
        self.ready = False
        await self.health.enter_graceful_shutdown()
        log.info("draining: %d calls in progress", self._active)
        if self.queue is not None:
            self.queue.close()
        drained = True
        if self._active:
            try:
                await asyncio.wait_for(self._idle.wait(), timeout=max(0.0, deadline - time.monotonic() - stop_s))
            except TimeoutError:
                drained = False
                log.warning("shutdown timeout: %d accepted calls were not answered", self._active)
        await self._until_quiet(deadline - stop_s)
        await self._shutdown(grace=max(0.1, min(1.0, deadline - time.monotonic())))
        log.info("tulip stopped")
        return drained

    async def _until_quiet(self, deadline: float, quiet_s: float = 0.1) -> None:
        """Before the gRPC server stops: wait until no call has arrived for `quiet_s` (or `deadline`). Calls a client
        queued behind its connection's stream limit keep arriving while the accepted ones finish; refused here
        they get UNAVAILABLE "shutting down" (retry elsewhere), where a stopping server would cancel them."""
        seen, quiet_from = self.calls_seen, time.monotonic()
        while (now := time.monotonic()) - quiet_from < quiet_s and now < deadline:
            await asyncio.sleep(quiet_s / 4)
            if self.calls_seen != seen:
                seen, quiet_from = self.calls_seen, time.monotonic()

    async def stop(self) -> None:
        """Immediate stop (start-up failure, tests)."""
        self.draining = True
        self.ready = False
        if self.queue is not None:
            self.queue.close()
        await self._shutdown(grace=0)

    async def _shutdown(self, grace: float) -> None:
        try:
            await self._stop_parts(grace)
        finally:  # whatever failed above: no timer left holding this server, no heap left frozen for it
            self.gc_timer.remove()
            if self._frozen:
                gc_pauses.unfreeze()
                self._frozen = False

    async def _stop_parts(self, grace: float) -> None:
        if self._watchdog_task is not None:
            self._watchdog_task.cancel()
        if self._grpc is not None:
            await self._grpc.stop(grace)
        self.framed.close()  # after the drain: what its connections had open is answered
        if self.worker is not None:
            await asyncio.to_thread(self.worker.stop, 2.0)
        if self.express is not None:
            await asyncio.to_thread(self.express.stop, 2.0)
        close = getattr(self.engine, "close", None)
        if self.device_lost is not None:  # its CUDA calls could hang; what it would record came from a broken run
            log.warning("engine close skipped: the device was lost")
        elif callable(close):  # ROSE records its hot graph layouts (the prewarm manifest) on close
            try:
                await asyncio.to_thread(close)
            except Exception:  # noqa: BLE001 - shutting down anyway
                log.exception("engine close failed")
        self.metrics.shutdown()

    # -- admission (tulip.servicer and tulip.stream call these) ---------------------------------

    def admit(self, request: embed_pb2.EmbedRequest, remaining: float | None, received_at: float | None = None) -> Job:
        """Validate and queue one request (unary or streamed, read at `received_at`, a perf_counter stamp): its
        Job, counted as accepted until `settled()`. Raises TulipError (not ready, draining, invalid, queue full,
        deadline passed)."""
        self.calls_seen += 1
        if self.device_lost is not None:
            raise self.device_check.error()
        if self.draining:
            raise ShuttingDown("tulip is shutting down and takes no new work; retry on another replica")
        if not self.ready:
            raise NotReady("the model is still loading; retry when health reports SERVING")
        if self.stalled:
            raise Stalled("the replica is stalled (a batch is far overdue on the device); retry on another replica")
        if type(request) is UndecodableRequest:  # its bytes failed to decode (tulip.decoding.decode_embed_request)
            raise InvalidRequest(request.problem)
        parsed = parse_embed_request(request, self.limits)
        lane = lane_of(request.lane)  # checked either way: the wire contract
        if not self.config.lanes:
            lane = INTERACTIVE  # lanes off: one FCFS lane
        deadline = None
        if remaining is not None:
            if remaining <= 0:
                raise DeadlineExpired("deadline exceeded before the request was queued")
            deadline = time.monotonic() + remaining
            if self.config.deadline_admission:  # tulip/lanes.py: refused now rather than after waiting
                check_deadline(lane, self.queue.lane_tokens(lane), parsed.num_tokens, remaining,
                               self.worker.device_times.pace())
        job = Job(parsed, native_dimensions=self.limits.dimensions, loop=self._loop, deadline=deadline,
                  request_id=request.request_id, flow=request.flow, lane=lane, received_at=received_at)
        inline = self.worker.inline
        self.queue.push(job, job.sequences, wake=not inline)
        self._active += 1
        if inline:
            try:
                self.worker.launch_here()
            except Exception:  # noqa: BLE001 - the job is queued: the launcher must get it whatever failed here
                log.exception("inline launch failed; the launcher takes the request")
                self.queue.wake()
        return job

    def settled(self, job: Job | None, status: str, started: float, tokens: int = 0) -> None:
        """One request answered (or refused, job None): drain bookkeeping and metrics."""
        if job is not None:
            self._active -= 1
            if self.draining and self._active == 0:
                self._idle.set()
        self.metrics.observe_request(status, time.perf_counter() - started, tokens)

    def rejected(self, request_id: str, exc: TulipError) -> None:
        # counted in metrics; no log flood
        quiet = isinstance(exc, (NotReady, ShuttingDown, QueueFull, Stalled, DeadlineUnmeetable))
        log.log(logging.DEBUG if quiet else logging.INFO, "Embed %s rejected: %s: %s",
                request_id or "-", exc.status, exc.message)


def _heartbeat(path: str, device: str) -> Heartbeat | None:
    """The batch counter `ivy up` asked for (TULIP_ACTIVITY_FILE), kept only on a GPU: its warm-cores loops are
    for a host whose cores wait on the device, and beside a replica on the CPU they would take the model's cores
    (benchmarks/NOTES.md, "Cores kept warm while the stack serves"). A path that cannot be written costs the
    counter, not the replica."""
    if not path or not device.startswith("cuda"):
        return None
    try:
        return Heartbeat(path)
    except OSError as exc:
        log.warning("no batch counter at %s (%s): `ivy up` keeps no core warm for this replica", path, exc)
        return None
