"""`python -m benchmarks.stack.lanes`: interactive queries beside bulk indexing, lanes off and on (issue 17).

    python -m benchmarks.stack.lanes --model-dir DIR --out OUT [--duration-s 10] [--up-flags "--gpus 0"]

One run, up to six configurations, each measured for `--duration-s` after every client warmed up:
- idle:  the interactive client alone (Tulip's defaults);
- fcfs:  interactive + bulk with TULIP_LANES=false (every request in one FCFS lane, whatever it names);
- lanes: interactive + bulk with lanes on and express off (TULIP_EXPRESS_BATCH_TOKENS=0: interactive first,
  bulk's guaranteed share, every batch run to completion);
- express: interactive + bulk with TULIP_BULK_LAYERS_AHEAD=0: interactive work beside the bulk batch on the
  express lane (tulip/express.py, rose/express.py);
- layers: interactive + bulk with Tulip's defaults (TULIP_BULK_LAYERS_AHEAD=`--layers-ahead`, 2; another value on
  a stack of its own): bulk batches stepped one decoder layer at a time from per-layer CUDA graphs, interactive
  batches on the same stream between two of its layers (tulip/express.py, rose/layer_graphs.py);
- capped: express off, TULIP_INTERACTIVE_BATCH_TOKENS=`--capped-batch-tokens` (2048): every batch capped
  while interactive traffic is about (tulip/packer.py); not run by default (`--configs` names it).
Interactive: 1 closed-loop client sending single `--query-tokens` (32) token queries, priority interactive;
with `--interactive-rate` R it offers R queries a second on a fixed schedule instead (each configuration then
asks the device for the same interactive work, while it keeps up; a closed-loop client served 4 x faster
asks 4 x as often).
Bulk: `--bulk-clients` (4) closed-loop clients sending `--bulk-docs` (100) lognormal documents a request
(benchmarks/stack/corpus.py), priority bulk. This command starts the stacks itself with `ivy up` (the same
flags and environment, e.g. IVY_WORKERS, plus `--up-flags`): one with the defaults for idle and layers, one
each for fcfs, lanes, express and capped, since Tulip reads them at start. Every client is its own process (load.py).

Writes OUT/lanes[_<label>].json = {"env" (commit, GPU, model, stacks), "targets", "records": [{"config",
"traffic", "clients", "p50_ms", "p99_ms", "rps", "tokens_per_s", ...}]} and OUT/lanes[_<label>].png, and
prints the table and the targets last: interactive p99 with lanes <= 2 x idle p99, bulk tokens/s with lanes
>= 90 % of FCFS. Exit codes: 0 done, 2 bad configuration, 4 a stack or a configuration failed (the file is
written all the same). Every flag is also a BENCH_LANES_* variable.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from benchmarks.stack.__main__ import EXIT_CONFIG, EXIT_SERVER
from benchmarks.stack.client import StackClient, StackError
from benchmarks.stack.config import _f
from benchmarks.stack.corpus import Corpus, CorpusError, DocumentMaker, TokenCounter, lognormal_lengths
from benchmarks.stack.lanes_report import CONFIGS, table, write_lanes
from benchmarks.stack.layers_report import headline_env
from benchmarks.stack.load import Budget, ClientSpec, Request, parse_cpus, run_clients_apart
from benchmarks.stack.report import collect_env, failed_record, summarize
from benchmarks.stack.server_counters import delta, scrape
from benchmarks.stack.up_stack import StackFailed, Terminated, UpStack, UpStackFields, raise_on_sigterm
from ivy.http_connection import HTTPError
from rose.flags import add_config_arguments, config_from_args
from tulip.config import TulipConfig
from rose.spec import bundled_model_dir, load_spec

ENV_PREFIX = "BENCH_LANES"


@dataclass(frozen=True)
class LanesConfig(UpStackFields):
    model_dir: str = _f("", "model folder `ivy up` serves; its tokenizer cuts the texts; empty = the bundled MiniLM")
    out: str = _f("benchmarks/results", "folder for lanes[_<label>].json and .png")
    label: str | None = _f(None, "suffix of the result files: lanes_<label>.json")
    logs: str = _f("", "folder for each stack's `ivy up` log (lanes[_<label>]_<stack>.log); empty = --out")
    configs: str = _f("idle,fcfs,express,layers", "configurations to run, some of " + ", ".join(CONFIGS))
    duration_s: float = _f(10.0, "measuring time per configuration, seconds")
    warmup_requests: int = _f(3, "untimed requests per client before each configuration is measured")
    distinct_inputs: int = _f(8, "distinct requests per client, sent round-robin")
    bulk_clients: int = _f(4, "bulk: closed-loop client processes")
    bulk_docs: int = _f(100, "bulk: documents per request")
    query_tokens: int = _f(32, "interactive: tokens of each single-query request")
    doc_mu: float = _f(round(math.log(128), 4), "bulk: lognormal mu of document tokens")
    doc_sigma: float = _f(0.8, "bulk: lognormal sigma of document tokens")
    doc_min_tokens: int = _f(16, "bulk: shortest document in tokens (clip)")
    doc_max_tokens: int = _f(512, "bulk: longest document in tokens (clip; also clipped to the model's max length)")
    seed: int = _f(0, "seed of every input choice")
    timeout_s: float = _f(300.0, "timeout of one HTTP request, seconds")
    client_cpus: str | None = _f(None, "CPUs for the client processes, e.g. 8-15; default: no pinning")
    plot: bool = _f(True, "draw OUT/lanes[_<label>].png at the end (needs matplotlib)")
    capped_batch_tokens: int = _f(2048, "the capped configuration's TULIP_INTERACTIVE_BATCH_TOKENS")
    layers_ahead: int = _f(2, "the layers configuration's TULIP_BULK_LAYERS_AHEAD")
    interactive_rate: float = _f(0.0, "interactive queries a second the client offers on a fixed schedule (a paced "
                                      "client: every configuration asks the same work of the device, while it keeps "
                                      "up); 0 = closed loop, the next query as soon as the last is answered")

    def chosen(self) -> tuple[str, ...]:
        wanted = [c.strip() for c in self.configs.split(",") if c.strip()]
        if unknown := [c for c in wanted if c not in CONFIGS]:
            raise ValueError(f"unknown configuration(s) {', '.join(unknown)}; choose from {', '.join(CONFIGS)}")
        if not wanted:
            raise ValueError("--configs names none")
        for name in ("bulk_clients", "bulk_docs", "query_tokens", "distinct_inputs"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.duration_s <= 0:
            raise ValueError("--duration-s must be positive")
        if self.interactive_rate < 0:
            raise ValueError("--interactive-rate must be 0 (closed loop) or positive")
        return tuple(c for c in CONFIGS if c in wanted)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def make_requests(config: LanesConfig, model_dir: str) -> tuple[list[Request], list[list[Request]], dict]:
    """(the interactive client's requests, each bulk client's, what the inputs are), seeded."""
    counter = TokenCounter(model_dir)
    maker = DocumentMaker(Corpus.load(), counter)
    hi = min(config.doc_max_tokens, load_spec(Path(model_dir)).max_length)
    lo = min(config.doc_min_tokens, hi)
    rng = random.Random(f"{config.seed}:interactive")
    interactive = [Request((maker.document(rng, config.query_tokens),), config.query_tokens, priority="interactive")
                   for _ in range(config.distinct_inputs)]
    bulk = []
    for client in range(config.bulk_clients):
        rng = random.Random(f"{config.seed}:bulk:{client}")
        requests = []
        for _ in range(config.distinct_inputs):
            lengths = lognormal_lengths(rng, config.bulk_docs, config.doc_mu, config.doc_sigma, lo, hi)
            requests.append(Request(tuple(maker.documents(rng, lengths)), sum(lengths), priority="bulk"))
        bulk.append(requests)
    facts = {"corpus": maker.corpus.describe(), "tokenizer": counter.describe(), "doc_tokens": [lo, hi],
             "bulk_tokens_per_request": sum(r.tokens for c in bulk for r in c) / (len(bulk) * config.distinct_inputs)}
    return interactive, bulk, facts


class LanesRun:
    def __init__(self, config: LanesConfig, argv: Sequence[str]) -> None:
        self.config = config
        self.model_dir = config.model_dir or str(bundled_model_dir())
        self.interactive, self.bulk, inputs = make_requests(config, self.model_dir)
        self.cpus = parse_cpus(config.client_cpus)
        self.records: list[dict[str, Any]] = []
        self.stacks: dict[str, dict[str, Any]] = {}
        self.out = Path(config.out)
        self.stem = "lanes" + (f"_{config.label}" if config.label else "")
        self.env = headline_env(collect_env(dataclasses.asdict(config), ["-m", "benchmarks.stack.lanes", *argv],
                                            self.stacks, inputs))
        self.env["stacks"] = self.env.pop("server")
        self.env["model_dir"] = self.model_dir

    def run(self, configs: tuple[str, ...]) -> None:
        capped = {"TULIP_LANES": "true", "TULIP_EXPRESS_BATCH_TOKENS": "0",
                  "TULIP_INTERACTIVE_BATCH_TOKENS": str(self.config.capped_batch_tokens)}
        groups = [("defaults", {"TULIP_LANES": "true"}, [c for c in configs if c in ("idle", "layers")]),
                  ("lanes-off", {"TULIP_LANES": "false"}, [c for c in configs if c == "fcfs"]),
                  ("express-off", {"TULIP_LANES": "true", "TULIP_EXPRESS_BATCH_TOKENS": "0"},
                   [c for c in configs if c == "lanes"]),
                  ("express-lane", {"TULIP_LANES": "true", "TULIP_BULK_LAYERS_AHEAD": "0"},
                   [c for c in configs if c == "express"]),
                  ("lanes-capped", capped, [c for c in configs if c == "capped"])]
        if self.config.layers_ahead != TulipConfig.bulk_layers_ahead:  # not the default: a stack of its own
            groups[0] = ("defaults", {"TULIP_LANES": "true"}, [c for c in configs if c == "idle"])
            groups.append(("bulk-layers", {"TULIP_LANES": "true", "TULIP_BULK_LAYERS_AHEAD": str(self.config.layers_ahead)},
                           [c for c in configs if c == "layers"]))
        for name, env, members in groups:
            if members:
                self.on_stack(name, env, members)

    def on_stack(self, name: str, env: dict[str, str], members: list[str]) -> None:
        c = self.config
        stack = UpStack.of(self.model_dir, Path(c.logs or c.out) / f"{self.stem}_{name}.log", c, env)
        say(f"== stack {name} ({' '.join(f'{k}={v}' for k, v in env.items())}): starting ivy up")
        facts = self.stacks[name] = {**env, "argv": stack.argv()[1:]}
        try:
            stack.start()
            facts["ready_s"] = stack.ready_s
            with StackClient(stack.url, "") as probe:
                listing = probe.models() or {}
            facts["models"] = listing
            model = (listing.get("data") or [{}])[0].get("id")
            if not model:
                raise StackFailed("GET /v1/models lists no model")
            self.env["model"] = model
            say(f"   ready after {stack.ready_s} s, serving {model}")
            for config in members:
                self.measure(config, stack, model)
        except (StackFailed, StackError, HTTPError, OSError) as exc:
            error = f"stack {name}: {type(exc).__name__}: {exc}"
            say(f"   {error}")
            facts["error"] = error
            done = {(r["config"], r["traffic"]) for r in self.records}
            self.records += [self.failed(config, traffic, error) for config in members
                             for traffic in self.traffics(config) if (config, traffic) not in done]
        finally:
            facts["exit_code"] = stack.stop()
        self.write()

    @staticmethod
    def traffics(config: str) -> tuple[str, ...]:
        return ("interactive",) if config == "idle" else ("interactive", "bulk")

    def failed(self, config: str, traffic: str, error: str) -> dict[str, Any]:
        clients = 1 if traffic == "interactive" else self.config.bulk_clients
        return {"config": config, "traffic": traffic, "clients": clients, **failed_record("lanes", clients, error)}

    def measure(self, config: str, stack: UpStack, model: str) -> None:
        c = self.config
        spec = ClientSpec(stack.url, model, timeout_s=c.timeout_s, cpus=self.cpus)
        per_client = [self.interactive] + (self.bulk if config != "idle" else [])
        marks: dict[str, dict[str, float]] = {}

        def mark() -> None:
            marks["before"] = self.counters(stack)

        say(f"== {config}: 1 interactive client{'' if config == 'idle' else f' + {c.bulk_clients} bulk'}")
        try:
            pace = 1.0 / c.interactive_rate if c.interactive_rate > 0 else 0.0
            apart = run_clients_apart(spec, per_client, Budget(c.duration_s, 0, c.warmup_requests), config,
                                      on_start=mark, paces=(pace,))
            after = self.counters(stack)
            server = delta(marks["before"], after) if marks.get("before") and after else None
            groups = [("interactive", apart[:1])] + ([("bulk", apart[1:])] if config != "idle" else [])
            for traffic, samples in groups:
                flat = [s for client in samples for s in client]
                record = {"config": config, "traffic": traffic, "clients": len(samples),
                          **summarize("lanes", len(samples), flat), "server": server}
                self.records.append(record)
                say(f"   {traffic:11s} p50 {record['p50_ms']:.2f} ms  p99 {record['p99_ms']:.2f} ms  "
                    f"{record['rps']:.1f} req/s  {record['tokens_per_s']:.0f} tok/s  errors {record['errors']}")
        except (StackError, HTTPError, OSError) as exc:
            self.records += [self.failed(config, t, f"{type(exc).__name__}: {exc}") for t in self.traffics(config)]
        self.write()

    @staticmethod
    def counters(stack: UpStack) -> dict[str, float] | None:
        try:
            return scrape([stack.metrics_url])
        except (OSError, ValueError):
            return None

    def write(self, plot: bool = False) -> list[Path]:
        return write_lanes(self.out, self.stem, self.env, self.records, plot)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stack.lanes", description=__doc__.split("\n")[0])
    add_config_arguments(parser, LanesConfig, ENV_PREFIX)
    config = config_from_args(LanesConfig, parser.parse_args(argv), ENV_PREFIX)
    try:
        configs = config.chosen()
        run = LanesRun(config, argv)
    except (ValueError, CorpusError) as exc:
        say(f"error: {exc}")
        return EXIT_CONFIG
    raise_on_sigterm()
    try:
        run.run(configs)
    except Terminated as exc:  # the stack is stopped (on_stack's finally); what ran is written
        say(f"{exc}")
        run.env["terminated"] = str(exc)
    paths = run.write(plot=config.plot)
    failed = [r for r in run.records if r.get("error")] + ([run.env["terminated"]] if "terminated" in run.env else [])
    say("wrote " + ", ".join(map(str, paths)) + (f"; {len(failed)} record(s) failed" if failed else ""))
    print(table(run.records), flush=True)
    return EXIT_SERVER if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
