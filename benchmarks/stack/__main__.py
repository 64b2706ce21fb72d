"""`python -m benchmarks.stack --url URL --model NAME [--suite ...]`: benchmark a deployed stack.

Order: read the server's model listing (max length), time a trivial round trip (the client's and the
network's share), verify the embeddings against the reference (stop on divergence), run the suites,
write OUT/stack_<model>[_<label>].json (after every suite, and at the end) and the plots. A step that
fails is recorded with its error and the run goes on. `--tulip HOST:PORT` measures one Tulip over gRPC
with token ids instead of the URL. Exit codes: 0 done, 2 bad configuration, 3 verification failed,
4 the server is unreachable or a step failed (the file is written all the same).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from benchmarks.stack.client import ROUTE_STYLES, StackError
from benchmarks.stack.config import BenchConfig
from ivy.http_connection import HTTPError
from benchmarks.stack.context import INPUTS, IdTokenizer
from benchmarks.stack.corpus import Corpus, CorpusError, DocumentMaker, TokenCounter
from benchmarks.stack.load import ClientSpec, parse_cpus
from benchmarks.stack.report import CostBasis, collect_env, result_stem, write_plots, write_result
from benchmarks.stack.servers import IdsFace, http_server, tulip_server, verification
from benchmarks.stack.suites import SuiteContext, run_suites
from benchmarks.stack.tulip_client import CALLS, TulipSpec
from benchmarks.stack.verify import VerificationError
from rose.flags import add_config_arguments, config_from_args

EXIT_CONFIG, EXIT_VERIFY, EXIT_SERVER = 2, 3, 4


def parse(argv: Sequence[str] | None) -> BenchConfig:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stack",
        description="Benchmark a deployed embedding stack (or a peer) by URL: the seed's four suites.")
    add_config_arguments(parser, BenchConfig, "BENCH")
    config = config_from_args(BenchConfig, parser.parse_args(argv), "BENCH")
    return dataclasses.replace(config, input="ids") if config.tulip else config  # Tulip takes token ids


def check(config: BenchConfig) -> tuple[str, ...]:
    if not config.model:
        raise ValueError("--model is required (the name the server serves; it also names the result file)")
    if config.route_style not in ROUTE_STYLES:
        raise ValueError(f"--route-style must be one of {', '.join(ROUTE_STYLES)}")
    if config.encoding_format not in ("float", "base64"):
        raise ValueError("--encoding-format must be float or base64")
    if config.duration_s <= 0 and config.requests <= 0:
        raise ValueError("set --duration-s or --requests (both are 0)")
    if config.input not in INPUTS:
        raise ValueError(f"--input must be one of {', '.join(INPUTS)}")
    if config.tulip_call not in CALLS:
        raise ValueError(f"--tulip-call must be one of {', '.join(CALLS)}")
    if config.reference is None and not config.skip_verify:
        raise ValueError("--reference FILE is required (python -m benchmarks.stack.reference makes one); "
                         "--skip-verify true runs without the check")
    return config.suites()


def redact(argv: Sequence[str]) -> list[str]:
    """The command line without the API key's value (results are committed)."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--api-key" and i + 1 < len(out):
            out[i + 1] = "***"
        elif arg.startswith("--api-key="):
            out[i] = "--api-key=***"
    return out


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _connect(config: BenchConfig) -> tuple[Any, Any, str]:
    """The layer this run measures: (spec, client, what) - the URL over HTTP, or one Tulip over gRPC."""
    cpus = parse_cpus(config.client_cpus)
    if config.tulip:
        spec: Any = TulipSpec(config.tulip, config.tulip_call, config.timeout_s, cpus)
        return spec, spec.connect(), f"tulip {config.tulip} ({config.tulip_call} RPC, token ids)"
    spec = ClientSpec(config.url, config.model, config.route_style, config.encoding_format, config.api_key,
                      config.timeout_s, cpus)
    return spec, spec.connect(), f"{config.url} ({config.route_style} routes, {config.input} input)"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    config = parse(argv)
    try:
        suites = check(config)
        parse_cpus(config.client_cpus)
        corpus = Corpus.load()
        counter = TokenCounter(config.tokenizer)
        tokenize = IdTokenizer(counter) if config.input == "ids" else None
    except (ValueError, CorpusError) as exc:
        say(f"error: {exc}")
        return EXIT_CONFIG
    spec, client, what = _connect(config)
    if spec.cpus and hasattr(os, "sched_setaffinity"):  # the latency suites' client runs here
        os.sched_setaffinity(0, spec.cpus)
    cost = CostBasis(config.gpu_hour_price, config.gpus)
    say(f"benchmark {config.model} at {what}: {', '.join(suites)}")
    if not counter.exact:
        say("note: no --tokenizer: input lengths are approximated by words (0.6 words a token), not exact")
    out_dir, stem = Path(config.out), result_stem(config.model, config.label)
    records: list[dict[str, Any]] = []
    with client:
        try:
            server = tulip_server(config, client) if config.tulip else http_server(config, client)
        except (HTTPError, StackError) as exc:
            say(f"error: cannot reach {config.tulip or config.url}: {type(exc).__name__}: {exc}")
            return EXIT_SERVER
        max_length = server["max_length"]
        say(f"server max length: {max_length or 'unknown'}; trivial round trip: {server['baseline_round_trip']}")
        try:
            face = IdsFace(lambda s: client.embed_matrix(s)[0], tokenize) if config.tulip else client
            server["verification"] = verification(config, face)
        except (VerificationError, StackError, HTTPError) as exc:
            say(f"error: {exc}")
            return EXIT_VERIFY
        if server["verification"].get("skipped"):
            say(f"warning: verification skipped ({server['verification'].get('reason', '--skip-verify')})")
        else:
            say(f"verification passed: max cosine divergence {100 * server['verification']['max_divergence']:.5f} % "
                f"over {server['verification']['probes']} probes")
        ctx = SuiteContext(config, client, spec, DocumentMaker(corpus, counter), max_length, cost,
                           tokenize=tokenize)

        def write(done: list[dict[str, Any]]) -> Path:  # after every suite: a killed run keeps what finished
            inputs = {"corpus": corpus.describe(), "tokenizer": counter.describe(), "input": config.input,
                      "lognormal": {"mu": config.doc_mu, "sigma": config.doc_sigma,
                                    "clip_tokens": list(ctx.doc_range())},
                      "skipped": ctx.skipped}
            env = collect_env(dataclasses.asdict(config) | {"api_key": "***" if config.api_key else None},
                              ["-m", "benchmarks.stack", *redact(argv)], server, inputs)
            env["cost_basis"] = {"gpu_hour_price_usd": config.gpu_hour_price, "gpus": config.gpus}
            return write_result(out_dir, stem, env, done)

        records = run_suites(ctx, suites, after_suite=write)
    path = write(records)
    plots = write_plots(out_dir, stem, records, f"{config.model}" + (f" ({config.label})" if config.label else ""))
    if config.dump_inputs:
        (out_dir / f"{stem}_inputs.json").write_text(json.dumps(ctx.inputs) + "\n")
    failed = [r for r in records if r.get("error")]
    say(f"wrote {path}" + "".join(f", {p}" for p in plots)
        + (f"; {len(failed)} step(s) failed: " + "; ".join(f"{r['suite']} {r['param']}" for r in failed)
           if failed else ""))
    return EXIT_SERVER if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
