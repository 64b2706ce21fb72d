"""`python -m benchmarks.stack.soak`: a stack under steady load at 70 % of saturation; is it flat (issue 15)?

    python -m benchmarks.stack.soak --model-dir DIR --out OUT [--duration-s 480] [--up-flags "--gpus 0"]

Starts a stack with `ivy up` (the same flags and environment, e.g. IVY_WORKERS, plus `--up-flags`), finds
saturation briefly (closed-loop clients 1, 2, 4, ... on the soak's own mix for `--saturation-step-s` each,
until the request rate stops growing; benchmarks/stack/soak_load.py), then drives Poisson arrivals at
`--rate-fraction` (0.7) of that rate for `--duration-s`: `--batch-share` of the arrivals are batches of
`--batch-docs` lognormal documents (benchmarks/stack/corpus.py), the rest single `--query-tokens` queries.
Every `--interval-s` (10) it samples the interval's p50/p99 per kind, errors by status, the RSS of every
process of the stack (`ivy up`, the gateway and its workers, each Tulip: /proc) and Tulip's gauges (ROSE's
pinned bytes in use and allocated, the queue depth: /metrics); soak_probe.py, soak_report.py.

The device limit: one device command runs at most 600 s and the machine does not stay up between calls,
so the issue's 10 minutes cannot run in one call; the load phase is at most ~8 minutes (the default 480 s),
and benchmarks/soak_device.sh sizes `--duration-s` by the call's $BUDGET (about 6 minutes in a fresh call).

Writes OUT/soak_<model>[_<label>].json = {"env" (commit, GPU, the stack), "saturation" (rate, steps),
"rate_per_s", "intervals", "verdict", "clients"} and the PNG (p99, RSS, pinned bytes over time), and prints
a short table last, the verdict its last line (soak_report.py says what each check is). Exit codes: 0 done
(whatever the verdict), 2 bad configuration, 4 the stack or the load failed (the file is written all the
same). Every flag is also a BENCH_SOAK_* variable.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from benchmarks.stack.__main__ import EXIT_CONFIG, EXIT_SERVER
from benchmarks.stack.client import StackClient, StackError
from benchmarks.stack.config import _f
from benchmarks.stack.corpus import Corpus, CorpusError, DocumentMaker, TokenCounter, lognormal_lengths
from benchmarks.stack.layers_report import headline_env
from benchmarks.stack.load import ClientSpec, Request, parse_cpus
from benchmarks.stack.report import collect_env
from benchmarks.stack.soak_load import Finished, OpenLoop, open_loop, ramp
from benchmarks.stack.soak_probe import sample_rss, scrape_gauges, stack_processes
from benchmarks.stack.soak_report import intervals, table, verdict, write_soak
from benchmarks.stack.up_stack import StackFailed, Terminated, UpStack, UpStackFields, raise_on_sigterm
from ivy.http_connection import HTTPError
from rose.flags import add_config_arguments, config_from_args
from rose.lazy import size_class
from rose.spec import bundled_model_dir, load_spec

ENV_PREFIX = "BENCH_SOAK"


@dataclass(frozen=True)
class SoakConfig(UpStackFields):
    model_dir: str = _f("", "model folder `ivy up` serves; its tokenizer cuts the texts; empty = the bundled MiniLM")
    out: str = _f("benchmarks/results", "folder for soak_<model>[_<label>].json and .png")
    label: str | None = _f(None, "suffix of the result files: soak_<model>_<label>.json")
    logs: str = _f("", "folder for the stack's `ivy up` log (soak_<model>.log); empty = --out")
    duration_s: float = _f(480.0, "seconds of open-loop load (one device call holds at most ~8 minutes of it)")
    interval_s: float = _f(10.0, "seconds between samples (latency, RSS, pinned bytes, queue depth)")
    rate_fraction: float = _f(0.7, "open-loop arrival rate as a fraction of the saturation request rate")
    batch_share: float = _f(0.25, "share of requests that are document batches (the rest: single queries)")
    batch_docs: int = _f(32, "documents per batch request")
    query_tokens: int = _f(32, "tokens of each single-query request")
    doc_mu: float = _f(round(math.log(128), 4), "lognormal mu of document tokens")
    doc_sigma: float = _f(0.8, "lognormal sigma of document tokens")
    doc_min_tokens: int = _f(16, "shortest document in tokens (clip)")
    doc_max_tokens: int = _f(512, "longest document in tokens (clip; also clipped to the model's max length)")
    distinct_inputs: int = _f(16, "distinct requests of each kind, sent round-robin")
    saturation_step_s: float = _f(5.0, "seconds per step of the closed-loop ramp that finds saturation")
    saturation_max_clients: int = _f(64, "most closed-loop clients of the ramp (it doubles from 1)")
    saturation_growth: float = _f(0.05, "the ramp stops when a step's rate grows less than this over the best")
    load_procs: int = _f(4, "open-loop client processes (each a Poisson stream at rate / procs)")
    load_threads: int = _f(32, "keep-alive connections per open-loop process (requests in flight at most)")
    max_batch_seqs: int = _f(256, "Tulip's sequences per batch (TULIP_MAX_BATCH_SEQS): sizes one batch's pinned bytes")
    seed: int = _f(0, "seed of every input choice and of the arrivals")
    timeout_s: float = _f(60.0, "timeout of one HTTP request, seconds")
    client_cpus: str | None = _f(None, "CPUs for the client processes, e.g. 8-15; default: no pinning")
    plot: bool = _f(True, "draw the PNG at the end (needs matplotlib)")

    def check(self) -> None:
        for name in ("batch_docs", "query_tokens", "distinct_inputs", "saturation_max_clients", "load_procs",
                     "load_threads", "max_batch_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        for name in ("duration_s", "interval_s", "saturation_step_s", "timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")
        if not 0 < self.rate_fraction <= 1 or not 0 <= self.batch_share <= 1:
            raise ValueError("--rate-fraction must be in (0, 1] and --batch-share in [0, 1]")


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def make_requests(c: SoakConfig, model_dir: str) -> tuple[list[Request], list[Request], list[Request], dict]:
    """(single queries, document batches, the ramp's mix of both at --batch-share, what the inputs are)."""
    counter = TokenCounter(model_dir)
    maker = DocumentMaker(Corpus.load(), counter)
    hi = min(c.doc_max_tokens, load_spec(Path(model_dir)).max_length)
    lo = min(c.doc_min_tokens, hi)
    rng = random.Random(f"{c.seed}:soak")
    queries = [Request((maker.document(rng, c.query_tokens),), c.query_tokens) for _ in range(c.distinct_inputs)]
    batches = []
    for _ in range(c.distinct_inputs):
        lengths = lognormal_lengths(rng, c.batch_docs, c.doc_mu, c.doc_sigma, lo, hi)
        batches.append(Request(tuple(maker.documents(rng, lengths)), sum(lengths)))
    n = 4 * c.distinct_inputs  # exactly --batch-share of them batches, spread evenly
    mixed = [batches[i % len(batches)] if math.floor((i + 1) * c.batch_share) > math.floor(i * c.batch_share)
             else queries[i % len(queries)] for i in range(n)]
    facts = {"corpus": maker.corpus.describe(), "tokenizer": counter.describe(), "doc_tokens": [lo, hi],
             "batch_tokens_per_request": sum(r.tokens for r in batches) / len(batches)}
    return queries, batches, mixed, facts


class SoakRun:
    def __init__(self, config: SoakConfig, argv: Sequence[str]) -> None:
        self.config = config
        self.model_dir = config.model_dir or str(bundled_model_dir())
        self.queries, self.batches, self.mixed, inputs = make_requests(config, self.model_dir)
        self.cpus = parse_cpus(config.client_cpus)
        self.stack_facts: dict[str, Any] = {}
        self.env = headline_env(collect_env(dataclasses.asdict(config), ["-m", "benchmarks.stack.soak", *argv],
                                            self.stack_facts, inputs))
        self.env["stack"] = self.env.pop("server")
        self.env["model_dir"] = self.model_dir
        self.result: dict[str, Any] = {"env": self.env, "interval_s": config.interval_s, "saturation": None,
                                       "rate_per_s": None, "intervals": [], "verdict": None}
        self.finished: list[Finished] = []
        self.probes: list[dict[str, Any]] = []
        self.one_batch_bytes = 0

    def run(self) -> None:
        c = self.config
        stack = UpStack.of(self.model_dir, Path(c.logs or c.out) / f"soak_{Path(self.model_dir).name}.log", c)
        self.stack_facts["argv"] = stack.argv()[1:]
        say("== starting ivy up")
        try:
            stack.start()
            self.stack_facts["ready_s"] = stack.ready_s
            self.soak(stack)
        except (StackFailed, StackError, HTTPError, OSError) as exc:
            self.result["error"] = f"{type(exc).__name__}: {exc}"
            say(f"   {self.result['error']}")
        finally:
            self.stack_facts["exit_code"] = stack.stop()
            self.conclude()

    def soak(self, stack: UpStack) -> None:
        c = self.config
        with StackClient(stack.url, "") as probe:
            model = ((probe.models() or {}).get("data") or [{}])[0].get("id")
            if not model:
                raise StackFailed("GET /v1/models lists no model")
            probe.model = model
            dim = probe.embeddings(["one"])[0].shape[1]
        self.env["model"] = model
        self.one_batch_bytes = size_class(c.max_batch_seqs * dim * 4)  # the largest output buffer of one batch
        pids = stack_processes(stack.pid or 0)
        tulips = sum(r == "tulip" for r in pids.values())
        urls = [f"http://127.0.0.1:{stack.metrics_port + k}/metrics" for k in range(tulips)]
        self.stack_facts.update(model=model, dimensions=dim, processes=sorted(pids.values()), metrics_urls=urls)
        say(f"   ready after {stack.ready_s} s, serving {model} ({dim} dims); processes {sorted(pids.values())}")
        spec = ClientSpec(stack.url, model, timeout_s=c.timeout_s, cpus=self.cpus)
        say(f"== saturation: closed loop, {c.batch_share:.0%} batches of {c.batch_docs} documents")
        best, steps = ramp(spec, self.mixed, c.saturation_step_s, c.saturation_max_clients, c.saturation_growth, say)
        rate = c.rate_fraction * best
        self.result.update(saturation={"rps": round(best, 2), "steps": steps}, rate_per_s=round(rate, 2))
        if rate <= 0:
            raise StackError("saturation: no request succeeded")
        say(f"== soak: {rate:.1f} req/s open loop ({c.rate_fraction:.0%} of {best:.1f}) for {c.duration_s:g} s")
        run = OpenLoop(spec, rate, c.duration_s, c.batch_share, c.load_procs, c.load_threads, c.seed)
        ticks = [k * c.interval_s for k in range(1, int(c.duration_s / c.interval_s + 1e-9) + 1)]
        if not ticks or ticks[-1] < c.duration_s - 1e-6:
            ticks.append(c.duration_s)
        clock: dict[str, float] = {}

        def take_probe(t_s: float) -> None:
            probe = {"t_s": round(t_s, 3), "rss_kb": sample_rss(stack.pid or 0), "gauges": scrape_gauges(urls)}
            self.probes.append(probe)
            g, done = probe["gauges"], len(self.finished)
            say(f"   t {t_s:6.1f} s  {done} done  max RSS {max(probe['rss_kb'].values(), default=0) / 1024:.0f} MiB"
                f"  pinned {g.get('pinned_in_use', 0) / 2**20:.1f}/{g.get('pinned_allocated', 0) / 2**20:.1f} MiB"
                f"  queue {g.get('queue_tokens', 0):.0f} tok")

        def on_start(t0: float) -> None:
            clock["t0"] = t0
            take_probe(0.0)

        def on_tick(fresh: list[Finished]) -> None:
            t0 = clock["t0"]
            self.finished += [(f[0] - t0, *f[1:]) for f in fresh]
            now = time.perf_counter() - t0
            while ticks and now >= ticks[0]:
                ticks.pop(0)
                take_probe(now)

        self.result["clients"] = open_loop(run, self.queries, self.batches, on_start, on_tick)
        if ticks:  # the clients finished before the last tick came round: the last probe now
            take_probe(time.perf_counter() - clock["t0"])

    def conclude(self) -> None:
        if self.probes:
            self.result["intervals"] = intervals(self.finished, self.probes)
            self.result["verdict"] = verdict(self.finished, self.probes, self.one_batch_bytes)

    @property
    def stem(self) -> str:
        """soak_<served model's last name part, else the folder's>[_<label>]."""
        model = str(self.env.get("model") or Path(self.model_dir).name).rsplit("/", 1)[-1]
        label = self.config.label
        return "soak_" + re.sub(r"[^A-Za-z0-9._-]+", "_", model) + (f"_{label}" if label else "")

    def write(self, plot: bool = False) -> list[Path]:
        return write_soak(Path(self.config.out), self.stem, self.result, plot)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stack.soak", description=__doc__.split("\n")[0])
    add_config_arguments(parser, SoakConfig, ENV_PREFIX)
    config = config_from_args(SoakConfig, parser.parse_args(argv), ENV_PREFIX)
    try:
        config.check()
        run = SoakRun(config, argv)
    except (ValueError, CorpusError) as exc:
        say(f"error: {exc}")
        return EXIT_CONFIG
    raise_on_sigterm()
    try:
        run.run()
    except Terminated as exc:  # the stack is stopped and what ran concluded (run's finally)
        say(f"{exc}")
        run.result["terminated"] = str(exc)
    paths = run.write(plot=config.plot)
    failed = run.result.get("error") or run.result.get("terminated")
    say("wrote " + ", ".join(map(str, paths)) + (f"; failed: {failed}" if failed else ""))
    print(table(run.result), flush=True)
    return EXIT_SERVER if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
