"""The seed's four suites, each: build its inputs, warm up, measure, summarize into records.

- embed-latency: one text per request at each of `embed_tokens` (128, 512, 4096), one client.
- score-latency: a `query_tokens` query against 5, 25, 50 documents of 512 tokens, one client.
- throughput: `throughput_processes` (4) client processes, each sending batches of 100 lognormal docs.
- concurrency: 1, 2, 4, 8, 16 client processes, one lognormal document per request.

Steps longer than the server's max length are skipped (listed in env.skipped); so is a step whose
warm-up the server rejects with a 4xx (e.g. a peer's max length the client could not read). A step
that fails otherwise (a 5xx, a gRPC error, a timeout, a client process that died) is a record with its
`error` and null numbers, and the run goes on. Inputs are seeded per (suite, step, client): a rerun, and
every layer of one run (context.py), sends the same requests.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any, Callable, Sequence

from benchmarks.stack.client import StackError
from ivy.http_connection import HTTPError
from benchmarks.stack.context import SuiteContext
from benchmarks.stack.corpus import CorpusError
from benchmarks.stack.load import Progress, Request, run_clients, run_loop, warm_up
from benchmarks.stack.report import failed_record, summarize
from benchmarks.stack.server_counters import delta, describe

__all__ = ["SUITE_FUNCTIONS", "STEP_ERRORS", "SuiteContext", "run_suites"]

# What a step may fail with (an HTTP or gRPC error, a timeout, a client process that died, inputs that
# cannot be made): the step is recorded with its error and the run goes on.
STEP_ERRORS = (StackError, HTTPError, CorpusError, OSError)


def _summary_line(record: dict[str, Any]) -> str:
    if record.get("error"):
        return f"failed: {record['error']}"
    server = describe(record["server"]) if record.get("server") else ""
    return (f"p50 {record['p50_ms']:.2f} ms  p95 {record['p95_ms']:.2f}  p99 {record['p99_ms']:.2f}  "
            f"{record['rps']:.1f} req/s  {record['tokens_per_s']:.0f} tok/s  errors {record['errors']}"
            + (f"  | cold {record['cold_requests']}, steady p99 {record['steady_p99_ms']:.2f}"
               if record.get("cold_requests") and record.get("steady_p99_ms") is not None else "")
            + (f"  | server: {server}" if server else ""))


def _with_server(ctx: SuiteContext, before: dict[str, float] | None, record: dict[str, Any]) -> dict[str, Any]:
    after = ctx.server_counters() if before is not None else None
    if before is not None and after is not None:
        record["server"] = delta(before, after)
    return record


def _failed(suite: str, param: int | None, exc: BaseException, **extra: Any) -> dict[str, Any]:
    record = failed_record(suite, param, f"{type(exc).__name__}: {exc}", **extra)
    print(f"  [{suite} {param}] {_summary_line(record)}", file=sys.stderr, flush=True)
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
        return _failed(suite, param, exc, **extra)
    except STEP_ERRORS as exc:
        return _failed(suite, param, exc, **extra)
    progress = Progress(label, ctx.budget)
    before = ctx.server_counters()
    try:
        samples = run_loop(ctx.client, requests, ctx.budget, progress=progress)
        record = _with_server(ctx, before, summarize(suite, param, samples, ctx.cost, **extra))
    except STEP_ERRORS as exc:
        return _failed(suite, param, exc, **extra)
    progress.finish(_summary_line(record))
    return record


def _measure_clients(ctx: SuiteContext, suite: str, param: int, per_client: list[list[Request]],
                     **extra: Any) -> dict[str, Any]:
    marks: dict[str, dict[str, float] | None] = {}  # read once every client has warmed up, at the start

    def mark() -> None:
        marks["before"] = ctx.server_counters()

    try:
        if ctx.replay is not None:  # the in-process layer: one engine here, no client processes
            mark()
            samples = ctx.replay(suite, per_client, ctx.budget)
        else:
            samples = run_clients(ctx.spec, per_client, ctx.budget, f"{suite} {param}", on_start=mark)
        record = _with_server(ctx, marks.get("before"), summarize(suite, param, samples, ctx.cost, **extra))
    except STEP_ERRORS as exc:
        return _failed(suite, param, exc, **extra)
    Progress(f"{suite} {param}", ctx.budget).finish(_summary_line(record))
    return record


def embed_latency(ctx: SuiteContext) -> list[dict[str, Any]]:
    c = ctx.config
    records = []
    for tokens in c.embed_tokens:
        if ctx.too_long("embed-latency", tokens, tokens):
            continue
        rng = ctx.rng("embed-latency", tokens)
        docs = ctx.maker.documents(rng, [tokens] * c.distinct_inputs)
        requests = [ctx.request((doc,), tokens) for doc in docs]
        ctx.keep("embed-latency", tokens, requests)
        record = _measure_here(ctx, "embed-latency", tokens, requests, tokens_requested=tokens, batch_size=1,
                               input=c.input)
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
        requests = [ctx.request([pool[(i * n_docs + j) % len(pool)] for j in range(n_docs)],
                                c.query_tokens + n_docs * c.score_doc_tokens, query=q)
                    for i, q in enumerate(queries)]
        ctx.keep("score-latency", n_docs, requests)
        record = _measure_here(ctx, "score-latency", n_docs, requests, documents=n_docs,
                               doc_tokens=c.score_doc_tokens, query_tokens=c.query_tokens,
                               input=c.input, route=ctx.client.score_route(c.input == "ids"))
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
            batches.append(ctx.request([d for d, _ in docs], sum(n for _, n in docs)))
        per_client.append(batches)
    ctx.keep("throughput", c.throughput_batch, per_client)
    lo, hi = ctx.doc_range()
    return [_measure_clients(ctx, "throughput", c.throughput_batch, per_client, batch_size=c.throughput_batch,
                             clients=c.throughput_processes, doc_tokens_range=[lo, hi], input=c.input)]


def concurrency(ctx: SuiteContext) -> list[dict[str, Any]]:
    c = ctx.config
    records = []
    for level in c.concurrency_levels:
        per_client = [[ctx.request((doc,), n) for doc, n in ctx.lognormal_docs(ctx.rng("concurrency", level, k),
                                                                            c.distinct_inputs)]
                      for k in range(level)]
        ctx.keep("concurrency", level, per_client)
        records.append(_measure_clients(ctx, "concurrency", level, per_client, clients=level, batch_size=1,
                                        input=c.input))
    return records


SUITE_FUNCTIONS: dict[str, Callable[[SuiteContext], list[dict[str, Any]]]] = {
    "embed-latency": embed_latency,
    "score-latency": score_latency,
    "throughput": throughput,
    "concurrency": concurrency,
}


def run_suites(ctx: SuiteContext, suites: Sequence[str],
               after_suite: Callable[[list[dict[str, Any]]], object] | None = None) -> list[dict[str, Any]]:
    """Every suite in order; a step that fails is a record with its `error`, and the run goes on.
    `after_suite(records so far)` runs after each suite (e.g. to write the file so far)."""
    records: list[dict[str, Any]] = []
    for suite in suites:
        print(f"suite {suite}", file=sys.stderr, flush=True)
        try:
            records += SUITE_FUNCTIONS[suite](ctx)
        except Exception as exc:  # noqa: BLE001 - inputs that cannot be made, or a bug: the suite as one
            traceback.print_exc()  # failed record, and the run goes on to the next
            records.append(_failed(suite, None, exc, input=ctx.config.input))
        if after_suite is not None:
            after_suite(records)
    return records
