"""The benchmark's one frozen config: every field is a `--flag` and a `BENCH_…` environment variable."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

SUITES = ("embed-latency", "score-latency", "throughput", "concurrency")


def _f(default, help_text: str):  # noqa: ANN001, ANN202 - a field whose help becomes its --help
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class BenchConfig:
    url: str = _f("http://127.0.0.1:8000", "base URL of the deployed gateway (or a peer)")
    model: str = _f("", "model name sent in every request; also names the result file")
    suite: str = _f("all", "all, or a comma-separated list of: " + ", ".join(SUITES))
    out: str = _f("benchmarks/results", "folder for stack_<model>.json and the PNG plots")
    label: str | None = _f(None, "suffix for the result file (e.g. a peer's name): stack_<model>_<label>.json")
    tokenizer: str | None = _f(None, "model folder (or tokenizer.json) to cut inputs to exact token counts; "
                                     "without it lengths are approximated by words")
    reference: str | None = _f(None, "reference embedding file (python -m benchmarks.stack.reference)")
    skip_verify: bool = _f(False, "run without the warm-up verification (recorded in the result)")
    verify_tolerance: float = _f(0.001, "largest allowed cosine divergence (1 - cos) per probe")
    route_style: str = _f("ours", "ours: /v1/embeddings + /v1/rerank; openai: /v1/embeddings only, "
                                  "scoring by client-side cosine")
    encoding_format: str = _f("base64", "encoding_format of timed embedding requests (float or base64)")
    api_key: str | None = _f(None, "bearer token, when the server wants one")
    timeout_s: float = _f(60.0, "timeout of one HTTP request in seconds")
    client_cpus: str | None = _f(None, "CPUs for the client processes, e.g. 12-15 (keeps load generation off "
                                       "the gateway's and batcher's cores); default: no pinning")
    max_length: int | None = _f(None, "server max input tokens when GET /v1/models does not report it")
    gpu_hour_price: float = _f(3.5, "price of one GPU hour in USD, for the cost per million")
    gpus: int = _f(1, "GPUs behind the URL, for the cost per million")
    seed: int = _f(0, "seed of every input choice (same seed, same requests)")
    duration_s: float = _f(10.0, "measuring time per suite step (per concurrency level, ...); 0 = no limit")
    requests: int = _f(0, "request cap per suite step and client; 0 = no cap (the duration decides)")
    warmup_requests: int = _f(10, "untimed requests per suite step and client before measuring")
    distinct_inputs: int = _f(32, "distinct requests per suite step and client, sent round-robin")
    embed_tokens: tuple[int, ...] = _f((128, 512, 4096), "embed-latency: tokens per single-text request")
    score_documents: tuple[int, ...] = _f((5, 25, 50), "score-latency: documents per query")
    score_doc_tokens: int = _f(512, "score-latency: tokens per document")
    query_tokens: int = _f(32, "score-latency: tokens of the query")
    throughput_processes: int = _f(4, "throughput: concurrent client processes")
    throughput_batch: int = _f(100, "throughput: documents per request")
    concurrency_levels: tuple[int, ...] = _f((1, 2, 4, 8, 16), "concurrency: client counts (one document each)")
    doc_mu: float = _f(round(math.log(128), 4), "lognormal mu of document tokens (throughput, concurrency)")
    doc_sigma: float = _f(0.8, "lognormal sigma of document tokens")
    doc_min_tokens: int = _f(16, "shortest document in tokens (clip)")
    doc_max_tokens: int = _f(512, "longest document in tokens (clip; also clipped to the server max length)")
    server_metrics: str | None = _f(None, "Prometheus /metrics URL(s) of the server's replicas, comma-separated "
                                          "(Tulip's: the URLs `ivy up` prints): each record gets the engine's "
                                          "eager runs, captures and batches during its measurement")
    input: str = _f("text", "text: send the texts; ids: tokenize them here (--tokenizer) and send token-id lists "
                            "to /v1/embeddings (scoring: query + documents as one id batch, client cosine)")
    tulip: str | None = _f(None, "host:port of one Tulip: benchmark it directly over gRPC with token ids "
                                 "(--input ids implied) instead of the gateway at --url")
    tulip_call: str = _f("stream", "Tulip-direct RPC: stream (one long-lived EmbedStream per client process) "
                                   "or unary (Embed)")
    dump_inputs: bool = _f(False, "also write the exact request texts to <stem>_inputs.json (to replay in-process)")

    def suites(self) -> tuple[str, ...]:
        if self.suite == "all":
            return SUITES
        chosen = tuple(s.strip() for s in self.suite.split(",") if s.strip())
        unknown = [s for s in chosen if s not in SUITES]
        if unknown or not chosen:
            raise ValueError(f"unknown suite {unknown or self.suite!r}; choose all or some of {', '.join(SUITES)}")
        return chosen
