"""The seed's four suites, each: build its inputs, warm up, measure, summarize into records.

- embed-latency: one text per request at each of `embed_tokens` (128, 512, 4096), one client.
- score-latency: a `query_tokens` query against 5, 25, 50 documents of 512 tokens, one client.
- throughput: `throughput_processes` (4) client processes, each sending batches of 100 lognormal docs.
- concurrency: 1, 2, 4, 8, 16 client processes, one lognormal document per request.

Steps longer than the server's max length are skipped (listed in env.skipped); so is a step whose
warm-up the server rejects with a 4xx (e.g. a peer's max length the client could not read).
Inputs are seeded per (suite, step, client): a rerun sends the same requests.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from benchmarks.stack.client import StackClient, StackError
from benchmarks.stack.config import BenchConfig
from benchmarks.stack.corpus import DocumentMaker, lognormal_lengths
from benchmarks.stack.load import Budget, ClientSpec, Progress, Request, run_clients, run_loop, warm_up
from benchmarks.stack.report import CostBasis, summarize
from benchmarks.stack.server_counters import delta, describe, scrape


@dataclass
class SuiteContext:
    """What every suite needs; `skipped` and `inputs` are filled while suites run."""

    config: BenchConfig
    client: StackClient
    spec: ClientSpec
    maker: DocumentMaker
    max_length: int | None
    cost: CostBasis
    skipped: list[dict[str, Any]] = field(default_factory=list)
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def server_counters(self) -> dict[str, float] | None:
        """The server's counters now (--server-metrics), or None when not asked for or unreachable."""
        urls = [u.strip() for u in (self.config.server_metrics or "").split(",") if u.strip()]
        if not urls:
            return None
        try:
            return scrape(urls)
        except (OSError, ValueError) as exc:
            print(f"  server metrics unreadable ({type(exc).__name__}: {exc}); records go without", file=sys.stderr)
            return None

    def rng(self, *key: object) -> random.Random:
        return random.Random(":".join(map(str, (self.config.seed, *key))))  # str seeds are stable

    @property
    def budget(self) -> Budget:
        c = self.config
        return Budget(c.duration_s, c.requests, c.warmup_requests)

    def too_long(self, suite: str, param: int, tokens: int) -> bool:
        if self.max_length is not None and tokens > self.max_length:
            self.skip(suite, param, f"{tokens} tokens is over the server's max length {self.max_length}")
            return True
        return False

    def skip(self, suite: str, param: int, reason: str) -> None:
        self.skipped.append({"suite": suite, "param": param, "reason": reason})
        print(f"  [{suite} {param}] skipped: {reason}", file=sys.stderr, flush=True)

    def keep(self, suite: str, param: int, requests: list[Request] | list[list[Request]]) -> None:
        if self.config.dump_inputs:
            self.inputs.setdefault(suite, {})[str(param)] = _as_json(requests)

    def doc_range(self) -> tuple[int, int]:
        hi = self.config.doc_max_tokens
        if self.max_length is not None:
            hi = min(hi, self.max_length)
        return min(self.config.doc_min_tokens, hi), hi

    def lognormal_docs(self, rng: random.Random, count: int) -> list[tuple[str, int]]:
        lo, hi = self.doc_range()
        lengths = lognormal_lengths(rng, count, self.config.doc_mu, self.config.doc_sigma, lo, hi)
        return list(zip(self.maker.documents(rng, lengths), lengths, strict=True))


def _as_json(requests: list[Any]) -> list[Any]:
    if requests and isinstance(requests[0], list):
        return [_as_json(r) for r in requests]
    return [{"texts": list(r.texts), "tokens": r.tokens, **({"query": r.query} if r.query else {})}
            for r in requests]


def _summary_line(record: dict[str, Any]) -> str:
    server = describe(record["server"]) if record.get("server") else ""
    return (f"p50 {record['p50_ms']:.2f} ms  p95 {record['p95_ms']:.2f}  p99 {record['p99_ms']:.2f}  "
            f"{record['rps']:.1f} req/s  {record['tokens_per_s']:.0f} tok/s  errors {record['errors']}"
            + (f"  | server: {server}" if server else ""))


def _with_server(ctx: SuiteContext, before: dict[str, float] | None, record: dict[str, Any]) -> dict[str, Any]:
    after = ctx.server_counters() if before is not None else None
    if before is not None and after is not None:
        record["server"] = delta(before, after)
    return record


def _measure_here(ctx: SuiteContext, suite: str, param: int, requests: list[Request],
                  **extra: Any) -> dict[str, Any] | None:
    """Warm up and measure on the main process's client (the latency suites)."""
    label = f"{suite} {param}"
    try:
        warm_up(ctx.client, requests, ctx.config.warmup_requests)
    except StackError as exc:
        if exc.status is not None and 400 <= exc.status < 500:
            ctx.skip(suite, param, f"warm-up rejected: {exc}")
            return None
        raise
    progress = Progress(label, ctx.budget)
    before = ctx.server_counters()
    samples = run_loop(ctx.client, requests, ctx.budget, progress=progress)
    record = _with_server(ctx, before, summarize(suite, param, samples, ctx.cost, **extra))
    progress.finish(_summary_line(record))
    return record


def _measure_clients(ctx: SuiteContext, suite: str, param: int, per_client: list[list[Request]],
                     **extra: Any) -> dict[str, Any]:
    marks: dict[str, dict[str, float] | None] = {}  # read once every client has warmed up, at the start

    def mark() -> None:
        marks["before"] = ctx.server_counters()

    samples = run_clients(ctx.spec, per_client, ctx.budget, f"{suite} {param}", on_start=mark)
    record = _with_server(ctx, marks.get("before"), summarize(suite, param, samples, ctx.cost, **extra))
    Progress(f"{suite} {param}", ctx.budget).finish(_summary_line(record))
    return record


def embed_latency(ctx: SuiteContext) -> list[dict[str, Any]]:
    records = []
    for tokens in ctx.config.embed_tokens:
        if ctx.too_long("embed-latency", tokens, tokens):
            continue
        rng = ctx.rng("embed-latency", tokens)
        docs = ctx.maker.documents(rng, [tokens] * ctx.config.distinct_inputs)
        requests = [Request((doc,), tokens) for doc in docs]
        ctx.keep("embed-latency", tokens, requests)
        record = _measure_here(ctx, "embed-latency", tokens, requests, tokens_requested=tokens, batch_size=1)
        records += [record] if record else []
    return records


def score_latency(ctx: SuiteContext) -> list[dict[str, Any]]:
    c = ctx.config
    records = []
    for n_docs in c.score_documents:
        if ctx.too_long("score-latency", n_docs, c.score_doc_tokens):
            continue
        rng = ctx.rng("score-latency", n_docs)
        pool = ctx.maker.documents(rng, [c.score_doc_tokens] * max(n_docs, c.distinct_inputs))
        queries = ctx.maker.documents(rng, [c.query_tokens] * c.distinct_inputs)
        requests = [Request(tuple(pool[(i * n_docs + j) % len(pool)] for j in range(n_docs)),
                            c.query_tokens + n_docs * c.score_doc_tokens, query=q)
                    for i, q in enumerate(queries)]
        ctx.keep("score-latency", n_docs, requests)
        record = _measure_here(ctx, "score-latency", n_docs, requests, documents=n_docs,
                               doc_tokens=c.score_doc_tokens, query_tokens=c.query_tokens,
                               route=("/v1/rerank" if c.route_style == "ours" else "/v1/embeddings + cosine"))
        records += [record] if record else []
    return records


def throughput(ctx: SuiteContext) -> list[dict[str, Any]]:
    c = ctx.config
    batches_per_client = max(2, c.distinct_inputs // 4)
    per_client = []
    for proc in range(c.throughput_processes):
        rng = ctx.rng("throughput", c.throughput_batch, proc)
        batches = []
        for _ in range(batches_per_client):
            docs = ctx.lognormal_docs(rng, c.throughput_batch)
            batches.append(Request(tuple(d for d, _ in docs), sum(n for _, n in docs)))
        per_client.append(batches)
    ctx.keep("throughput", c.throughput_batch, per_client)
    lo, hi = ctx.doc_range()
    return [_measure_clients(ctx, "throughput", c.throughput_batch, per_client, batch_size=c.throughput_batch,
                             clients=c.throughput_processes, doc_tokens_range=[lo, hi])]


def concurrency(ctx: SuiteContext) -> list[dict[str, Any]]:
    c = ctx.config
    records = []
    for level in c.concurrency_levels:
        per_client = [[Request((doc,), n) for doc, n in ctx.lognormal_docs(ctx.rng("concurrency", level, k),
                                                                            c.distinct_inputs)]
                      for k in range(level)]
        ctx.keep("concurrency", level, per_client)
        records.append(_measure_clients(ctx, "concurrency", level, per_client, clients=level, batch_size=1))
    return records


SUITE_FUNCTIONS: dict[str, Callable[[SuiteContext], list[dict[str, Any]]]] = {
    "embed-latency": embed_latency,
    "score-latency": score_latency,
    "throughput": throughput,
    "concurrency": concurrency,
}
