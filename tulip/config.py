"""Tulip's one frozen configuration: every field is a `--flag` and a `TULIP_*` environment variable.

Batching defaults and why:
- ``max_batch_tokens`` 0 = by device. On a GPU 8192, from the H200 saturation curve of the 0.6B
  (benchmarks/NOTES.md, results/rose_gpu.json): with 16 / 64 sequences a batch of 4096 tokens runs at
  377 / 411 k tokens/s, 8192 at 390 / 430 k, 16384 at 363 / 405 k — past 8192 a batch buys no
  throughput, only head-of-line latency for whoever arrives behind it (21 ms vs 45 ms at 16 sequences).
  text-embeddings-inference defaults to 16384; small encoders still gain there (all-MiniLM-L6-v2: 5.1 M
  tokens/s at 8192 -> 6.2 M at 16384, 1.6 vs 2.6 ms per batch), so throughput-first MiniLM replicas may
  raise it. On a CPU 2048: all-MiniLM-L6-v2 on 2 cores went 168 -> 511 -> 886 -> 1317 -> 1435 tokens/s at
  128 / 512 / 1024 / 2048 / 4096 tokens per batch (ROSE, 2026-11-29), so 2048 is near saturation while
  a batch still takes about a second rather than ten.
- ``max_batch_seqs`` 256: the sequence-count bucket bounds cu_seqlens-shaped graph keys; 128 short queries
  of 64 tokens already fill the GPU token budget, 256 of 32.
- ``max_queue_tokens`` 262144 = 32 full batches: on an H200 about 0.65 s of backlog for the 0.6B
  model (at ~400 k tokens/s). Beyond it callers get RESOURCE_EXHAUSTED at once (Ivy turns it into 429 or
  sends it to another replica) rather than an unbounded queue that hides overload.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rose.flags import non_finite
from rose.log_format import check_format
from rose.persistent_routing import DEFAULT_ROUTING, routed_tokens

ENV_PREFIX = "TULIP"
GPU_BATCH_TOKENS = 8192
CPU_BATCH_TOKENS = 2048
_WARMUP_CHOICES = {"auto", "true", "false", "1", "0", "yes", "no", "on", "off"}


def _f(default, help_text: str):
    return field(default=default, metadata={"help": help_text})


_GRPC_MAX_S = (2**31 - 1) // 1000  # the longest gRPC time argument, in whole seconds (~24.8 days)


@dataclass(frozen=True)
class TulipConfig:
    host: str = _f("127.0.0.1", "address the gRPC server binds (0.0.0.0 for every interface)")
    port: int = _f(50051, "gRPC port; 0 picks a free one (the bound address is logged)")
    model: str = _f("", "Hugging Face model folder to serve; empty = the bundled all-MiniLM-L6-v2")
    served_model_name: str = _f("", "model id reported by the Info RPC (Ivy matches it); empty = the engine's")
    device: str = _f("auto", "cpu, cuda, cuda:N, or auto (cuda when torch sees a GPU, else cpu)")
    dtype: str = _f("", "float32, bfloat16 or float16; empty = ROSE's default for the device")
    attention: str = _f("auto", "attention backend for ROSE (auto = its measured choice per model)")
    persistent_decoder: str = _f(DEFAULT_ROUTING, "Qwen3 models and BERT-style encoders on CUDA: auto (default) = the "
                                          "layer shapes measured faster only (Qwen3-0.6B's up to 128 tokens, "
                                          "all-MiniLM's up to 16); on = batches of up to 128 tokens (Qwen3) or 16 "
                                          "(BERT-style); N = up to N tokens (at most 128); every layer in one "
                                          "persistent kernel (rose/layers/persistent_decoder.py; Qwen3-0.6B 9-15 % "
                                          "faster at 16-128 tokens on the H200); off = the layer-by-layer kernels")
    max_batch_tokens: int = _f(
        0, "token budget of one batch; a longer sequence runs alone; 0 = by device: 8192 on a GPU, 2048 on a CPU")
    max_batch_seqs: int = _f(256, "most sequences in one batch")
    max_queue_tokens: int = _f(262144, "most tokens waiting in the queue; beyond it RESOURCE_EXHAUSTED")
    request_share: float = _f(0.125, "part of a batch (its tokens and sequences) each waiting request is given, "
                                      "oldest first, before the oldest fill the rest, so a small request behind "
                                      "a huge one rides in the next batch (tulip/scheduler.py); 1 = request FCFS")
    lanes: bool = _f(True, "priority lanes (interactive first, bulk's share); false = one FCFS lane for every request "
                           "whatever lane it names, as before issue 17 (the A/B of benchmarks/stack/lanes.py)")
    bulk_share: float = _f(0.25, "priority lanes: while bulk requests wait, interactive ones fill a batch only up to "
                                 "(1 - this) of its tokens, so bulk gets at least this share (tulip/scheduler.py)")
    interactive_batch_tokens: int = _f(0, "priority lanes: while interactive requests wait or arrived within "
                                          "interactive_recent_ms, every batch is capped at this many tokens, so a "
                                          "query waits for at most such a batch, not a full bulk one; 0 = off "
                                          "(tulip/scheduler.py; the trade in benchmarks/results/lanes.json)")
    express_batch_tokens: int = _f(1024, "priority lanes: while bulk work is queued or running, interactive requests "
                                         "run beside it in batches of at most this many tokens: between its layers "
                                         "(bulk_layers_ahead; also on a CPU), else on a GPU on a higher-priority CUDA "
                                         "stream with graphs of their own (tulip/express.py, rose/express.py); at most "
                                         "max_batch_tokens; 0 = off (they wait for the bulk batch)")
    bulk_layers_ahead: int = _f(2, "priority lanes, a model that can be stepped layer by layer (the Qwen3 family; on a GPU "
                                   "with CUDA graphs and no FlashInfer attention, else the express lane): batches "
                                   "with bulk work are stepped one decoder layer at a time (per-layer CUDA graphs), at "
                                   "most this many layers on the device ahead, and interactive batches (up to "
                                   "express_batch_tokens) run on the same stream between two of them instead of on "
                                   "the express lane (tulip/express.py; benchmarks/results/lanes.json); 0 = off")
    interactive_recent_ms: float = _f(100.0, "how long after an interactive request interactive_batch_tokens still "
                                             "caps batches")
    deadline_admission: bool = _f(True, "refuse at once (RESOURCE_EXHAUSTED deadline_unmeetable) a request whose "
                                        "deadline a lower bound on the device time of its lane's queued tokens and "
                                        "its own already exceeds (tulip/pacing.py Pace); no measurement yet = admit")
    max_inflight_batches: int = _f(2, "batches launched on the engine and not yet delivered (2 = overlap)")
    inline_launch: bool = _f(True, "while the worker is idle, the event loop launches a request's batch itself when "
                                   "its CUDA graph is captured, instead of waking the launcher thread (one "
                                   "thread hand-off less per lone request, tulip/worker.py); off with idle capture")
    pack_ahead_ms: float = _f(1.0, "with a batch on the device, pack the next one this long before that batch is "
                                   "expected to finish (median device time of recent batches of its size), not "
                                   "as soon as a slot frees, so it takes in what arrived meanwhile; 0 = at once")
    watchdog_s: float = _f(10.0, "health turns NOT_SERVING (new work refused, `tulip health` fails) while the oldest "
                                 "batch in flight has been on the device longer than max(this, watchdog_factor x "
                                 "its expected device time), and SERVING again once it completes; 0 = off")
    watchdog_factor: float = _f(20.0, "see watchdog_s: multiple of a batch's expected device time (median of "
                                      "recent batches of its size) that counts as hung")
    cuda_graphs: str = _f("auto", "whole-model CUDA graphs with lazy capture: auto (on when on a GPU), true or false")
    prewarm: str = _f("128x1,512x1,2048x8,singles:512,mix:48",
                      "TOKENSxSEQS keys and named sets (singles:N = every layout of one sequence up to N tokens; "
                      "mix:K = the K hottest layouts of short-document traffic; rose/prewarm_sets.py) whose CUDA "
                      "graphs are captured and verified (replay vs eager) before the replica reports SERVING")
    graph_manifest: str = _f("auto", "file of hot graph layouts recorded from traffic and prewarmed at the next "
                                     "start; auto = rose_graphs.json beside the model (or ~/.cache/rose); off = none")
    kernel_manifest: str = _f("auto", "Triton kernel variants recorded by earlier starts and compiled ahead in worker "
                                      "processes at the next (rose/kernel_ahead.py); auto = rose_kernels.json beside "
                                      "the model (or ~/.cache/rose); off = none")
    idle_capture_ms: float = _f(0.0, "when the queue has been empty this long with nothing in flight, capture the "
                                     "graph of a layout that ran eagerly (its next batch would capture on the "
                                     "request path); 0 = off, the default until measured on a GPU")
    gc_freeze: bool = _f(True, "once ready, move every object alive into the garbage collector's permanent "
                               "generation (gc.freeze), so full collections walk only what requests made, "
                               "not torch's and the model's ~300 k objects (rose/gc_pauses.py); false = off")
    activity_file: str = _f("", "a file this replica counts its launched batches in (8 bytes, shared mapping; "
                                "protos/heartbeat.py), which `ivy up` reads to keep cores warm only while it works; "
                                "made on a GPU only (set by `ivy up`); empty = none")
    pinned_cap_mb: int = _f(256, "cap on ROSE's page-locked host memory for results, in MiB")
    framed_port: int = _f(-1, "TCP port of the framed EmbedStream (EmbedStream's messages behind a 4-byte length, "
                              "without gRPC's per-message cost; tulip/framed.py), named in Info for Ivy (IVY_FRAMED); "
                              "-1 = the gRPC port + 200 (ephemeral with --port 0), skipped with a warning when "
                              "taken; 0 = off")
    framed_direct: bool = _f(True, "a framed connection's answers are written to its socket by the completer thread "
                                   "that finishes them, not handed to the event loop first (one thread wake-up less "
                                   "on every answer's way out; tulip/framed.py); false = through the loop")
    framed_max_connections: int = _f(256, "most open connections on the framed port (Ivy opens one per gateway "
                                          "worker); one more is answered RESOURCE_EXHAUSTED and closed")
    metrics_port: int = _f(0, "Prometheus /metrics port on its own HTTP server; 0 = off")
    metrics_host: str = _f("127.0.0.1", "address the metrics server binds")
    shutdown_timeout_s: float = _f(30.0, "on SIGTERM, most seconds to finish accepted work before exiting")
    max_message_mb: int = _f(16, "largest gRPC message received or sent, in MiB; over it RESOURCE_EXHAUSTED")
    keepalive_time_s: float = _f(60.0, "server pings an idle connection after this many seconds")
    keepalive_timeout_s: float = _f(20.0, "closes a connection whose ping is unanswered this long")
    min_client_ping_interval_s: float = _f(
        10.0, "shortest client ping interval tolerated without data; clients must ping less often")
    warmup_full_batch: str = _f(
        "auto", "before ready, run one batch at the full token budget so a budget the device cannot hold "
                "fails at start-up: auto (on a GPU only), true or false")
    engine_factory: str = _f(
        "", "callable building the engine, 'module:attr' or 'file.py:attr' (tests, other engines); "
            "empty = rose.Engine.from_pretrained")
    event_loop: str = _f("auto", "auto (uvloop when installed, else asyncio), uvloop or asyncio: uvloop cut "
                         "Tulip's CPU per call 6-12 % on the 2-core VM (benchmarks/NOTES.md)")
    log_level: str = _f("info", "debug, info, warning or error; logs never contain token ids")
    log_format: str = _f("text", "text (lines for people) or json (one object a line: time, level, logger, "
                         "message, service, pid, exception; for a log pipeline)")

    def __post_init__(self) -> None:
        name = non_finite(self)
        if name is not None:
            raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        for name in ("max_batch_seqs", "max_queue_tokens", "max_inflight_batches", "max_message_mb",
                     "pinned_cap_mb"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_batch_tokens < 0:
            raise ValueError(f"max_batch_tokens must be 0 (by device) or positive, got {self.max_batch_tokens}")
        if self.event_loop not in ("auto", "uvloop", "asyncio"):
            raise ValueError(f"event_loop must be auto, uvloop or asyncio, got {self.event_loop!r}")
        check_format(self.log_format, "log_format")
        if str(self.cuda_graphs).lower() not in _WARMUP_CHOICES:
            raise ValueError(f"cuda_graphs must be one of {sorted(_WARMUP_CHOICES)}, got {self.cuda_graphs!r}")
        if str(self.warmup_full_batch).lower() not in _WARMUP_CHOICES:
            raise ValueError(f"warmup_full_batch must be one of {sorted(_WARMUP_CHOICES)}, "
                             f"got {self.warmup_full_batch!r}")
        if self.max_queue_tokens < self.max_batch_tokens:
            raise ValueError(f"max_queue_tokens ({self.max_queue_tokens}) must be at least "
                             f"max_batch_tokens ({self.max_batch_tokens})")
        if not all(0 <= p < 65536 for p in (self.port, self.metrics_port)) or not -1 <= self.framed_port < 65536:
            raise ValueError("ports must be in 0..65535 (framed_port -1 = the gRPC port + 200)")
        if self.framed_max_connections < 1:
            raise ValueError(f"framed_max_connections must be at least 1, got {self.framed_max_connections}")
        if self.shutdown_timeout_s < 0:
            raise ValueError("shutdown_timeout_s must not be negative")
        if self.max_message_mb > 2047:
            raise ValueError(f"max_message_mb must be at most 2047 (gRPC's message limits are 32-bit), "
                             f"got {self.max_message_mb}")
        for name in ("keepalive_time_s", "keepalive_timeout_s"):  # in whole milliseconds: 0 would ping every ms
            if getattr(self, name) < 0.001:
                raise ValueError(f"{name} must be at least 0.001 (1 ms), got {getattr(self, name)}")
        if self.min_client_ping_interval_s < 0:
            raise ValueError(f"min_client_ping_interval_s must be 0 or positive, got {self.min_client_ping_interval_s}")
        for name in ("keepalive_time_s", "keepalive_timeout_s", "min_client_ping_interval_s"):
            if getattr(self, name) > _GRPC_MAX_S:  # gRPC takes them as C ints of milliseconds
                raise ValueError(f"{name} must be at most {_GRPC_MAX_S} s (gRPC's 32-bit milliseconds), "
                                 f"got {getattr(self, name)}")
        routed_tokens(self.persistent_decoder)  # ValueError naming the setting and what it takes
        if self.pack_ahead_ms < 0:
            raise ValueError(f"pack_ahead_ms must be 0 (pack at once) or positive, got {self.pack_ahead_ms}")
        if not 0 < self.request_share <= 1:
            raise ValueError(f"request_share must be in (0, 1], got {self.request_share}")
        if not 0 <= self.bulk_share < 1:
            raise ValueError(f"bulk_share must be in [0, 1), got {self.bulk_share}")
        if self.interactive_batch_tokens < 0 or self.interactive_recent_ms < 0:
            raise ValueError("interactive_batch_tokens and interactive_recent_ms must be >= 0")
        if self.express_batch_tokens < 0:
            raise ValueError("express_batch_tokens must be >= 0")
        if self.bulk_layers_ahead < 0:
            raise ValueError("bulk_layers_ahead must be >= 0")
        if self.watchdog_s < 0 or self.watchdog_factor <= 0:
            raise ValueError(f"watchdog_s must be 0 (off) or positive and watchdog_factor positive, got "
                             f"{self.watchdog_s}, {self.watchdog_factor}")
        if self.idle_capture_ms < 0:
            raise ValueError(f"idle_capture_ms must be 0 (off) or positive, got {self.idle_capture_ms}")

    def batch_tokens_for(self, device: str) -> int:
        """The token budget on `device` ("cpu", "cuda", "cuda:1"...)."""
        if self.max_batch_tokens:
            return self.max_batch_tokens
        return GPU_BATCH_TOKENS if str(device).startswith("cuda") else CPU_BATCH_TOKENS

    def probe_full_batch_on(self, device: str) -> bool:
        choice = str(self.warmup_full_batch).lower()
        if choice == "auto":
            return str(device).startswith("cuda")
        return choice in ("true", "1", "yes", "on")

    @property
    def bulk_by_layers(self) -> bool:
        """Bulk is stepped layer by layer, interactive batches between its layers (tulip/express.py), where the
        engine can (its layer_steps)."""
        return bool(self.lanes and self.express_batch_tokens and self.bulk_layers_ahead > 0)

    @property
    def max_message_bytes(self) -> int:
        return self.max_message_mb * 1024 * 1024
