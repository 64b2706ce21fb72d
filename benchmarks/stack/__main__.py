"""`python -m benchmarks.stack --url URL --model NAME [--suite ...]`: benchmark a deployed stack.

Order: read the server's model listing (max length), time a trivial round trip (the client's and the
network's share), verify the embeddings against the reference (stop on divergence), run the suites,
write OUT/stack_<model>[_<label>].json and the plots. Exit codes: 0 done, 2 bad configuration,
3 verification failed, 4 the server failed a suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Sequence


from benchmarks.stack.client import ROUTE_STYLES, StackError
from benchmarks.stack.connection import HTTPError
from benchmarks.stack.config import BenchConfig
from benchmarks.stack.corpus import Corpus, CorpusError, DocumentMaker, TokenCounter
from benchmarks.stack.load import ClientSpec, parse_cpus
from benchmarks.stack.report import CostBasis, collect_env, result_stem, write_plots, write_result
from benchmarks.stack.suites import SUITE_FUNCTIONS, SuiteContext
from benchmarks.stack.verify import VerificationError, verify
from rose.flags import add_config_arguments, config_from_args

EXIT_CONFIG, EXIT_VERIFY, EXIT_SERVER = 2, 3, 4


def parse(argv: Sequence[str] | None) -> BenchConfig:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stack",
        description="Benchmark a deployed embedding stack (or a peer) by URL: the seed's four suites.")
    add_config_arguments(parser, BenchConfig, "BENCH")
    return config_from_args(BenchConfig, parser.parse_args(argv), "BENCH")


def check(config: BenchConfig) -> tuple[str, ...]:
    if not config.model:
        raise ValueError("--model is required (the name the server serves; it also names the result file)")
    if config.route_style not in ROUTE_STYLES:
        raise ValueError(f"--route-style must be one of {', '.join(ROUTE_STYLES)}")
    if config.encoding_format not in ("float", "base64"):
        raise ValueError("--encoding-format must be float or base64")
    if config.duration_s <= 0 and config.requests <= 0:
        raise ValueError("set --duration-s or --requests (both are 0)")
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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    config = parse(argv)
    try:
        suites = check(config)
        parse_cpus(config.client_cpus)
        corpus = Corpus.load()
        counter = TokenCounter(config.tokenizer)
    except (ValueError, CorpusError) as exc:
        say(f"error: {exc}")
        return EXIT_CONFIG
    spec = ClientSpec(config.url, config.model, config.route_style, config.encoding_format, config.api_key,
                      config.timeout_s, parse_cpus(config.client_cpus))
    if spec.cpus and hasattr(os, "sched_setaffinity"):  # the latency suites' client runs here
        os.sched_setaffinity(0, spec.cpus)
    cost = CostBasis(config.gpu_hour_price, config.gpus)
    say(f"benchmark {config.model} at {config.url} ({config.route_style} routes): {', '.join(suites)}")
    if not counter.exact:
        say("note: no --tokenizer: input lengths are approximated by words (0.6 words a token), not exact")
    with spec.connect() as client:
        try:
            client.http.get("/v1/models")
        except HTTPError as exc:
            say(f"error: cannot reach {config.url}: {type(exc).__name__}: {exc}")
            return EXIT_SERVER
        max_length = config.max_length or client.max_length()
        server = {"models": client.models(), "max_length": max_length,
                  "max_length_source": "flag" if config.max_length else ("server" if max_length else None),
                  "baseline_round_trip": client.baseline_latency_ms()}
        say(f"server max length: {max_length or 'unknown'}; trivial round trip: {server['baseline_round_trip']}")
        if config.skip_verify:
            server["verification"] = {"skipped": True}
            say("warning: verification skipped (--skip-verify)")
        else:
            assert config.reference is not None
            try:
                server["verification"] = verify(client, Path(config.reference), config.verify_tolerance)
            except (VerificationError, StackError, HTTPError) as exc:
                say(f"error: {exc}")
                return EXIT_VERIFY
            say(f"verification passed: max cosine divergence {100 * server['verification']['max_divergence']:.5f} % "
                f"over {server['verification']['probes']} probes")
        ctx = SuiteContext(config, client, spec, DocumentMaker(corpus, counter), max_length, cost)
        records = []
        try:
            for suite in suites:
                say(f"suite {suite}")
                records += SUITE_FUNCTIONS[suite](ctx)
        except (StackError, CorpusError, HTTPError) as exc:
            say(f"error: {type(exc).__name__}: {exc}")
            return EXIT_SERVER
    inputs = {"corpus": corpus.describe(), "tokenizer": counter.describe(),
              "lognormal": {"mu": config.doc_mu, "sigma": config.doc_sigma,
                            "clip_tokens": list(ctx.doc_range())},
              "skipped": ctx.skipped}
    env = collect_env(dataclasses.asdict(config) | {"api_key": "***" if config.api_key else None},
                      ["-m", "benchmarks.stack", *redact(argv)], server, inputs)
    env["cost_basis"] = {"gpu_hour_price_usd": config.gpu_hour_price, "gpus": config.gpus}
    out_dir = Path(config.out)
    stem = result_stem(config.model, config.label)
    path = write_result(out_dir, stem, env, records)
    plots = write_plots(out_dir, stem, records, f"{config.model}" + (f" ({config.label})" if config.label else ""))
    if config.dump_inputs:
        (out_dir / f"{stem}_inputs.json").write_text(json.dumps(ctx.inputs) + "\n")
    say(f"wrote {path}" + "".join(f", {p}" for p in plots))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
