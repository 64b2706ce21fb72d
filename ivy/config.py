"""Ivy's configuration: one frozen dataclass, every field a `--flag` and an `IVY_*` environment variable.

Built with rose.flags (flag > env > default). Runtime state (channels, tokenizer, counters) lives in
`ivy.gateway.Gateway`, never here, so the config can be handed to uvicorn workers as env vars.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rose.flags import non_finite
from rose.host_cpus import usable_cpus
from rose.log_format import FORMATS

ENV_PREFIX = "IVY"
GRPC_MAX_MESSAGE_BYTES = 2**31 - 1  # gRPC's message limits are 32-bit ints: a larger one fails each worker's start
CPUS_PER_WORKER = 4  # a gateway worker's share of the host: on the 16-core H200 host 4 workers served 3.5x one
# at 16 clients and left Tulip and the tokenizer threads their cores (benchmarks/NOTES.md, "Workers")
MAX_AUTO_WORKERS = 8


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True)
class IvyConfig:
    host: str = field(default="127.0.0.1", metadata=_help("Address the HTTP server binds."))
    port: int = field(default=8080, metadata=_help("HTTP port."))
    replicas: tuple[str, ...] = field(
        default=("127.0.0.1:50051",), metadata=_help(
            "Tulip replicas as host:port, comma separated; an entry dns:///NAME:PORT stands for every address "
            "NAME resolves to, resolved again every --health-interval-s."))
    replicas_dns: str = field(default="", metadata=_help(
        "NAME:PORT of a headless Service (k8s: tulip-headless.NAMESPACE.svc.cluster.local:50051) whose addresses "
        "are the Tulip replicas, resolved again every --health-interval-s so replicas join and leave live; "
        "set, it replaces --replicas."))
    model: str = field(default="", metadata=_help(
        "Model folder whose tokenizer Ivy uses (must be the one Tulip serves); empty = the bundled all-MiniLM-L6-v2."))
    served_model_name: str = field(default="", metadata=_help(
        "Name clients send as `model`; empty = the model's id (folder name or hub id)."))
    workers: int = field(default=0, metadata=_help(
        "uvicorn worker processes (HTTP, validation and tokenization scale with them); 0 = auto: one per "
        f"{CPUS_PER_WORKER} usable CPUs (affinity and cgroup quota), 1 to {MAX_AUTO_WORKERS}."))
    api_key: str = field(default="", metadata=_help(
        "Bearer token required, when set, on every route but /health, /ready and /metrics, which stay open: every "
        "POST route, GET /info, /v1/models and /v1/models/ID, and /docs, /redoc and /openapi.json unless --docs on "
        "(--api-key-lanes alone does the same)."))
    api_key_lanes: tuple[str, ...] = field(default=(), metadata=_help(
        "More accepted Bearer keys, each with its default priority lane: key1=bulk,key2=interactive (ivy/lanes.py); "
        "--api-key stays accepted too (its requests get a lane by size)."))
    bulk_above_tokens: int = field(default=4096, metadata=_help(
        "A request that names no lane (body priority, X-Priority, its key's lane) goes to the bulk lane when it "
        "holds more than this many tokens, else to the interactive lane."))
    cors_origins: tuple[str, ...] = field(default=(), metadata=_help(
        "Origins allowed by CORS, comma separated; empty = no CORS headers at all."))
    docs: str = field(default="auto", metadata=_help(
        "/docs, /redoc and /openapi.json: auto = open without --api-key, behind the key with one; "
        "on = always open; off = not served."))
    max_inputs_per_request: int = field(default=2048, metadata=_help(
        "Most inputs (or documents, or rerank documents) in one request; more gets 422."))
    max_chunks_per_request: int = field(default=16000, metadata=_help(
        "Most chunks over all documents of one contextualized-embeddings request."))
    max_output_values_per_request: int = field(default=64 * 1024 * 1024, metadata=_help(
        "Most float values the model's rows may hold for one /embed_multi_vector or /embed_sparse request, counted "
        "after tokenizing and before anything is sent: token vectors x their width (BGE-M3: 1024 a token) or, for "
        "SPLADE, whose rows cross from Tulip vocabulary-wide before Ivy keeps their non-zeros, inputs x the "
        "vocabulary; more gets 413 naming `inputs`. The default, 64 Mi, is 256 MiB of float32 in the worker (and "
        "~12 bytes a value as JSON): 8 BGE-M3 inputs of 8192 tokens or 128 of 512, and SPLADE at BERT's 30522-wide "
        "vocabulary up to --max-inputs-per-request's 2048 inputs; without it one request of token ids under the "
        "body limit could make GBs."))
    max_chars_per_input: int = field(default=0, metadata=_help(
        "Character cap applied before tokenization; 0 = 16 characters per model token (at least 4096)."))
    payload_limit_bytes: int = field(default=2 * 1024 * 1024, metadata=_help(
        "Largest request body in bytes, after decompression; larger gets 413 before JSON parsing."))
    max_concurrent_requests: int = field(default=512, metadata=_help(
        "Requests in flight over all workers (split evenly); over it: 429 with Retry-After."))
    client_share: float = field(default=0.5, metadata=_help(
        "A client's share of a worker's request slots (--max-concurrent-requests over the workers), a fraction "
        "above 0, rounded down to whole slots (at least 1): once a client holding less is refused as full, a "
        "client holding its share or more gets 429 with Retry-After for a few seconds rather than take the last "
        "eighth of the slots (the reserve), so clients flooding the cap cannot shut the others out. While so "
        "contended a client's share is at most all but the reserve split evenly among the clients wanting "
        "slots (at least 1: with as many clients as slots, each may take the reserve with none in flight); "
        "contention ends 3 s after the refused client stops coming back, and while no one is refused any "
        "client may fill the cap. A client is its key where Ivy checks keys, else its address (an IPv6 "
        "address's /64) as uvicorn reads it (behind a proxy uvicorn does not trust, FORWARDED_ALLOW_IPS, "
        "every request is the proxy's: one client). 1 = off."))
    body_bytes_in_flight: int = field(default=256 * 1024 * 1024, metadata=_help(
        "Bytes of request bodies one worker holds while reading them (before parsing; the concurrency cap counts "
        "requests only once their bodies are in): a body that would pass it gets 429 with Retry-After, so many "
        "clients uploading at once cannot take the worker's memory. 0 = no cap."))
    chunk_max_tokens: int = field(default=8192, metadata=_help(
        "Token budget of one gRPC chunk; a request is split into chunks sent concurrently to replicas."))
    chunk_max_seqs: int = field(default=64, metadata=_help("Most sequences in one gRPC chunk."))
    max_chunks_in_flight: int = field(default=0, metadata=_help(
        "Most chunks of one request on the replicas at once (the rest follow as they are answered); a replica "
        "whose queue is full is retried after a jittered pause until the deadline. 0 = 4 per serving replica."))
    coalesce: bool = field(default=True, metadata=_help(
        "Concurrent requests with the same output options that fit in one chunk share one gRPC call "
        "(sent after one turn of the event loop, never after a timer) while some replica is on its gRPC stream; "
        "over the framed EmbedStream each request is its own call (cheaper there: benchmarks/NOTES.md, "
        "'Coalescing'); false = one call per request always."))
    grpc_stream: bool = field(default=True, metadata=_help(
        "Send requests over one long-lived EmbedStream per replica (multiplexed by id, each with its deadline) "
        "instead of a unary call each; responses over 1 MiB still take a unary call. false = unary only."))
    framed: bool = field(default=True, metadata=_help(
        "Send the stream's requests over the replica's framed EmbedStream where its Info names a framed port "
        "(Tulip's --framed-port: the same messages on plain TCP without gRPC's per-message cost, tulip/framed.py; "
        "-0.5 ms a request on the H200, benchmarks/NOTES.md); replicas without one, or a port that refuses, use "
        "the gRPC stream. Health, Info and large answers stay on gRPC. false = the gRPC stream only."))
    max_header_bytes: int = field(default=64 * 1024, metadata=_help(
        "Largest request line plus headers in bytes; over it: 431 and the connection is closed."))
    header_read_timeout_s: float = field(default=10.0, metadata=_help(
        "Seconds a request's line and headers may take from their first byte; then 408 and closed (slowloris)."))
    keep_alive_timeout_s: float = field(default=75.0, metadata=_help(
        "Seconds an idle connection (kept alive after an answer, or new and silent) stays open. Longer than the "
        "idle timeout of whatever sits in front (nginx 75 s, AWS ALB 60 s), or it reuses connections Ivy has "
        "closed and answers 502; open connections are bounded by --max-connections, not by this."))
    max_connections: int = field(default=0, metadata=_help(
        "Open connections per worker process; a new one over it closes the connection idle longest (no request "
        "in progress), or gets 503 and is closed at once when every one has a request in progress. "
        "0 = the process's open-file limit minus 256 and --probe-connections (so sockets never take every "
        "descriptor)."))
    probe_connections: int = field(default=8, metadata=_help(
        "Connections per worker process over --max-connections kept for health probes while every connection has "
        "a request in progress: one must send its request within 1 s, only a GET of /health, /ready or /metrics is "
        "served (then closed), anything else gets 503 with Retry-After; a new one over a full reserve closes the "
        "one waiting longest for its request. So a gateway that is only busy passes its liveness probe. 0 = none: "
        "a fast 503 for every connection over the cap."))
    gc_freeze: bool = field(default=True, metadata=_help(
        "once a worker serves, move every object alive into the garbage collector's permanent generation "
        "(gc.freeze), so full collections walk only what requests made, not FastAPI's, pydantic's and the "
        "tokenizer's ~75 k objects (rose/gc_pauses.py); false = off"))
    send_timeout_s: float = field(default=30.0, metadata=_help(
        "Seconds an answer may wait on a client that reads nothing (the connection's send buffer stays full: "
        "no progress at all, however slow the link); then the connection is dropped with its unsent bytes. "
        "Progress is what the kernel takes from the buffer, in steps of about a third of the socket's send "
        "buffer (~1 MB): keep it above the time the slowest client takes to read that much. "
        "0 = never (a client that never reads holds its answer's memory for as long as it stays connected)."))
    body_read_timeout_s: float = field(default=10.0, metadata=_help(
        "Seconds the whole request body may take to arrive; a client trickling bytes gets 408 and is closed. The "
        "rest of a body answered before it was read (401, 413, 415, 422, 429) is read and discarded within it too."))
    request_timeout_s: float = field(default=30.0, metadata=_help(
        "Deadline of a request; the time left becomes each gRPC call's timeout (504 when it passes)."))
    truncate: bool = field(default=False, metadata=_help(
        "Default of the request's `truncate`: cut over-long inputs instead of answering 422."))
    tokenizer_threads: int = field(default=0, metadata=_help(
        "Threads per worker for templating and tokenization, off the event loop, and for the pieces of a long "
        "text (--tokenize-split-chars), and the size of `tokenizers`' own pool for a call of several texts "
        "(RAYON_NUM_THREADS, unless set); 0 = min(8, usable CPUs: the affinity set and a cgroup CPU limit)."))
    tokenize_inline_chars: int = field(default=2048, metadata=_help(
        "Requests of at most this many characters (or token ids) are tokenized on the event loop, skipping "
        "the hop to the tokenizer threads (~0.1 ms saved); larger ones go to the threads (unless "
        "--tokenize-warm-inline takes them). 0 = always threads, but for that."))
    tokenize_warm_inline: bool = field(default=True, metadata=_help(
        "Requests over --tokenize-inline-chars whose texts the word cache takes whole (ASCII, --tokenizer-cache-call-"
        "chars) and knows all but a few words of (at most 32 new, 1024 characters) are tokenized on the event loop too: "
        "those lookups hold the GIL in a thread just as long, so the hop would only add its hand-offs (4096 tokens: "
        "-0.17 to -0.3 ms in Ivy's app alone; level through the stack with warm cores). Off = threads."))
    tokenize_split_chars: int = field(default=1000, metadata=_help(
        "A text longer than this many characters is cut at boundaries its tokenizer splits at anyway and the "
        "pieces are encoded on several tokenizer threads (same ids as one encode); 0 = never split."))
    tokenize_piece_chars: int = field(default=500, metadata=_help(
        "Target length in characters of each piece of a split text (at most one piece per tokenizer thread)."))
    tokenizer_cache_words: int = field(default=65536, metadata=_help(
        "How many words' ids the tokenizer remembers for ASCII text (~8 MB per worker at 65536 ordinary words, at "
        "most ~16 MB): BERT-family tokenizers (a text cut at whitespace, ~6 x faster than `tokenizers`) and "
        "Qwen3-style byte-level BPE (cut by its Split regex, ~3-4 x). Same ids; new words are encoded by "
        "`tokenizers`. Full, it starts again empty. 0 = off; other tokenizers never."))
    tokenizer_bpe_whole_chars: int = field(default=32768, metadata=_help(
        "A Qwen3-style byte-level BPE text the word cache takes is encoded whole through it up to this many "
        "characters, in pieces (--tokenize-split-chars) above. Through the stack on the H200 host a 4096-token "
        "text's tokenizing took 1.6 ms whole through the cache against 2.6 in pieces (11c8496). BERT texts the "
        "cache takes (up to --tokenizer-cache-call-chars) are always whole. 0 = every BPE text longer than "
        "--tokenize-split-chars is cut."))
    tokenizer_cache_call_chars: int = field(default=32768, metadata=_help(
        "The word cache takes a request whose texts have at most this many characters in all (~6 k tokens); a larger "
        "one (a bulk batch of documents) goes to `tokenizers`, whose threads release the GIL: the cache's lookups "
        "are Python and would hold the gateway worker's other requests for milliseconds. 0 = every request."))
    health_interval_s: float = field(default=2.0, metadata=_help(
        "Seconds between health and Info probes of each replica."))
    replica_timeout_s: float = field(default=10.0, metadata=_help(
        "A chunk a replica has not answered in this many seconds, while another replica is shown to answer "
        "(idle, or answered since) and the request's deadline is further away, is cancelled there and re-sent "
        "elsewhere; the replica is ejected until a probe answers (a hung replica: SIGSTOP, a stuck GPU). Every "
        "replica late at once (a stalled host) is waited for. Above a full Tulip queue's work on a GPU "
        "(~1-3 s) and equal to Tulip's watchdog floor; 0 = wait until the deadline."))
    query_prefix: str = field(default="", metadata=_help(
        "Text prepended for input_type=query when the model has no `query` prompt."))
    document_prefix: str = field(default="", metadata=_help(
        "Text prepended for input_type=document when the model has no `document` prompt."))
    grpc_max_message_bytes: int = field(default=64 * 1024 * 1024, metadata=_help(
        "Largest gRPC message Ivy sends or receives; a larger one is answered 413."))
    drain_delay_s: float = field(default=0.0, metadata=_help(
        "On SIGTERM: /ready answers 503 at once and requests are still served this many seconds (so load "
        "balancers stop routing here) before the server stops accepting; in-flight requests then finish. "
        "Set it to your load balancer's or Kubernetes endpoints' propagation time (e.g. 5)."))
    log_level: str = field(default="info", metadata=_help("Log level: debug, info, warning, error."))
    log_format: str = field(default="text", metadata=_help(
        "text (lines for people) or json (one object a line: time, level, logger, message, service, pid, the "
        "request id being served, exception; for a log pipeline)."))
    access_log: bool = field(default=False, metadata=_help(
        "Log every HTTP request (uvicorn's access log: a line a request, in --log-format). Off by default: it "
        "costs each request a log record formatted and written."))

    def __post_init__(self) -> None:
        name = non_finite(self)
        if name is not None:
            raise SystemExit(f"ivy: --{name.replace('_', '-')} must be a finite number, not {getattr(self, name)}")
        if self.log_format not in FORMATS:
            raise SystemExit(f"ivy: --log-format must be one of {', '.join(FORMATS)}, not {self.log_format!r}")
        if not self.replicas:
            raise SystemExit("ivy: --replicas needs at least one host:port")
        if self.workers < 0:
            raise SystemExit("ivy: --workers must be 0 (auto: one per 4 usable CPUs) or positive")
        if self.workers == 0:  # auto, resolved here so every worker process and the metrics see the same count
            object.__setattr__(self, "workers", auto_workers())
        for name in ("port", "workers", "max_inputs_per_request", "max_chunks_per_request",
                     "max_output_values_per_request", "payload_limit_bytes",
                     "max_concurrent_requests", "chunk_max_tokens", "chunk_max_seqs", "grpc_max_message_bytes",
                     "max_header_bytes"):
            if getattr(self, name) < 1:
                raise SystemExit(f"ivy: --{name.replace('_', '-')} must be at least 1")
        for name in ("request_timeout_s", "health_interval_s", "body_read_timeout_s"):
            if getattr(self, name) <= 0:
                raise SystemExit(f"ivy: --{name.replace('_', '-')} must be positive")
        if self.port > 65535:
            raise SystemExit(f"ivy: --port must be at most 65535, not {self.port}")
        if self.grpc_max_message_bytes > GRPC_MAX_MESSAGE_BYTES:
            raise SystemExit(f"ivy: --grpc-max-message-bytes must be at most {GRPC_MAX_MESSAGE_BYTES} (gRPC's "
                             f"message limits are 32-bit), not {self.grpc_max_message_bytes}")
        if self.tokenize_piece_chars < 1:
            raise SystemExit("ivy: --tokenize-piece-chars must be at least 1")
        for name in ("drain_delay_s", "tokenizer_threads", "max_chars_per_input", "tokenize_inline_chars",
                     "tokenize_split_chars"):  # each 0 = off or auto; below it means nothing
            if getattr(self, name) < 0:
                raise SystemExit(f"ivy: --{name.replace('_', '-')} must be 0 or positive, not {getattr(self, name)}")
        if self.replica_timeout_s < 0:
            raise SystemExit("ivy: --replica-timeout-s must be 0 (off) or positive")
        if self.bulk_above_tokens < 0:
            raise SystemExit("ivy: --bulk-above-tokens must be 0 or positive")
        if self.tokenizer_bpe_whole_chars < 0:
            raise SystemExit("ivy: --tokenizer-bpe-whole-chars must be 0 (always pieces) or positive")
        if self.tokenizer_cache_call_chars < 0:
            raise SystemExit("ivy: --tokenizer-cache-call-chars must be 0 (every request) or positive")
        if self.tokenizer_cache_words < 0:
            raise SystemExit("ivy: --tokenizer-cache-words must be 0 (off) or positive")
        from ivy.lanes import parse_key_lanes

        try:
            parse_key_lanes(self.api_key_lanes)
        except ValueError as exc:
            raise SystemExit(f"ivy: {exc}") from None
        if not 0 < self.client_share <= 1:
            raise SystemExit(f"ivy: --client-share must be above 0 and at most 1 (off), not {self.client_share}")
        if self.max_chunks_in_flight < 0:
            raise SystemExit("ivy: --max-chunks-in-flight must be 0 (4 per serving replica) or positive")
        if self.header_read_timeout_s <= 0 or self.keep_alive_timeout_s <= 0 or self.max_connections < 0 \
                or self.probe_connections < 0:
            raise SystemExit("ivy: --header-read-timeout-s and --keep-alive-timeout-s must be positive, "
                             "--max-connections and --probe-connections at least 0")
        if self.body_bytes_in_flight and self.body_bytes_in_flight < self.payload_limit_bytes:
            raise SystemExit("ivy: --body-bytes-in-flight must be 0 (no cap) or at least --payload-limit-bytes")
        if self.send_timeout_s < 0:
            raise SystemExit("ivy: --send-timeout-s must be 0 (never) or positive")
        if self.docs not in ("auto", "on", "off"):
            raise SystemExit("ivy: --docs must be auto, on or off")
        from ivy.discovery import is_dns, parse  # torch-free, tiny

        for entry in ((self.replicas_dns,) if self.replicas_dns else ()) + tuple(filter(is_dns, self.replicas)):
            try:
                parse(entry)
            except ValueError as exc:
                raise SystemExit(f"ivy: {exc}") from None

    def replica_entries(self) -> tuple[str, ...]:
        """What the replica pool follows: the --replicas-dns name when set, else --replicas."""
        return (f"dns:///{self.replicas_dns}",) if self.replicas_dns else self.replicas

    def tokenizer_thread_count(self) -> int:
        return self.tokenizer_threads or min(8, usable_cpus())

    def char_cap(self, max_length: int) -> int:
        return self.max_chars_per_input or max(16 * max_length, 4096)

    def per_worker_concurrency(self) -> int:
        return max(1, -(-self.max_concurrent_requests // self.workers))


def auto_workers(cpus: int | None = None) -> int:
    """--workers 0: one gateway worker per CPUS_PER_WORKER usable CPUs, at least 1, at most MAX_AUTO_WORKERS."""
    return max(1, min(MAX_AUTO_WORKERS, (cpus or usable_cpus()) // CPUS_PER_WORKER))
