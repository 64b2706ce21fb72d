"""`python -m benchmarks.stack.layers`: the stack's layers measured apart, in one run, on the same requests.

    python -m benchmarks.stack.layers --url http://IVY --tulip HOST:PORT --model-dir DIR --model NAME \
        --suite all --out DIR [--inprocess true] [--server-metrics URL] [--client-cpus 12-15]

Layers, by default in this order (`--layers` picks some, the servers' in the order it names them): `ivy-text`
(the gateway with texts), `ivy-ids` (the gateway with the client's own token ids), `tulip-grpc` (one Tulip over
gRPC with ids, `--tulip-call stream|unary`; needs `--tulip`), `tulip-framed` (the same Tulip over its framed
EmbedStream, the transport Ivy uses: the port its Info names) and, with `--inprocess true`, `inprocess`
(rose.Engine in this process, after the servers' layers; the server may stay up) and `inprocess-closed` (the same
engine as L closed-loop clients with a harness that costs nothing, the concurrency suite only: inprocess_closed.py
says why).
Every layer runs the same suites on the same seeded requests (context.py). Each layer is verified against `--reference` when given, on what it is
measured with. A step that fails is a record with its `error`; a layer that cannot start (unreachable,
verification failed, no torch) has one such record per suite; the run goes on. OUT/stack_layers_<model>.json
is written after every suite and at the end, OUT/stack_layers_<model>.png at the end (redraw one from a
file: python -m benchmarks.stack.layers_report FILE.json). Exit codes: 0 done,
2 bad configuration, 4 some step failed (the file is written all the same).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from benchmarks.stack.__main__ import EXIT_CONFIG, EXIT_SERVER, redact
from benchmarks.stack.config import BenchConfig, _f
from benchmarks.stack.context import IdTokenizer, SuiteContext
from benchmarks.stack.corpus import Corpus, CorpusError, DocumentMaker, TokenCounter
from benchmarks.stack.layers_report import INPROCESS, LAYERS, TULIP, headline_env, layers_stem, write_layers
from benchmarks.stack.load import ClientSpec, parse_cpus
from benchmarks.stack.report import CostBasis, collect_env, failed_record
from benchmarks.stack.servers import IdsFace, http_server, tulip_server, verification
from benchmarks.stack.suites import run_suites
from benchmarks.stack.tulip_client import CALLS, TulipSpec
from rose.flags import add_config_arguments, config_from_args


@dataclass(frozen=True)
class LayersConfig(BenchConfig):
    model_dir: str | None = _f(None, "the served model folder: the token ids' tokenizer (--tokenizer's default) "
                                     "and the in-process engine")
    layers: str = _f(",".join(LAYERS), "the layers to run, some of " + ", ".join(LAYERS)
                     + " (the servers' in the order given, in-process last)")
    inprocess: bool = _f(False, "run the in-process layer (rose.Engine here: needs torch; the GPU or the CPU)")
    device: str | None = _f(None, "the in-process engine's device, cuda or cpu (default: cuda when available)")


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse(argv: Sequence[str]) -> LayersConfig:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stack.layers", description=__doc__.split("\n")[0])
    add_config_arguments(parser, LayersConfig, "BENCH")
    config = config_from_args(LayersConfig, parser.parse_args(argv), "BENCH")
    return dataclasses.replace(config, tokenizer=config.tokenizer or config.model_dir)


def check(config: LayersConfig) -> tuple[tuple[str, ...], list[str]]:
    if not config.model:
        raise ValueError("--model is required (the name the gateway serves; it also names the result file)")
    if not config.tokenizer:
        raise ValueError("--model-dir (or --tokenizer) is required: the id layers tokenize with it")
    if config.tulip_call not in CALLS:
        raise ValueError(f"--tulip-call must be one of {', '.join(CALLS)}")
    wanted = [s.strip() for s in config.layers.split(",") if s.strip()]
    if unknown := [s for s in wanted if s not in LAYERS]:
        raise ValueError(f"unknown layer(s) {', '.join(unknown)}; choose from {', '.join(LAYERS)}")
    # the servers' layers in the order given (which runs first on a fresh stack is a choice), in-process last
    servers = [name for name in dict.fromkeys(wanted) if name not in INPROCESS and (name not in TULIP or config.tulip)]
    layers = servers + [name for name in INPROCESS if name in wanted and config.inprocess]
    if set(INPROCESS) & set(layers) and not config.model_dir:
        raise ValueError("--inprocess true needs --model-dir (the engine loads it)")
    if not layers:
        raise ValueError("no layer to run (tulip-grpc and tulip-framed need --tulip, inprocess --inprocess true)")
    return config.suites(), layers


class LayersRun:
    """The layers one after another, the records so far, and the file written after every suite."""

    def __init__(self, config: LayersConfig, argv: Sequence[str], suites: tuple[str, ...]) -> None:
        self.config, self.suites = config, suites
        self.corpus, self.counter = Corpus.load(), TokenCounter(config.tokenizer)
        self.tokenize = IdTokenizer(self.counter)
        self.maker = DocumentMaker(self.corpus, self.counter)
        self.cpus = parse_cpus(config.client_cpus)
        self.records: list[dict[str, Any]] = []
        self.servers: dict[str, dict[str, Any]] = {}
        self.skipped: dict[str, list[dict[str, Any]]] = {}
        self.max_length = config.max_length  # the first layer's, for all: the same requests everywhere
        self.batch_limits: dict[str, int] = {}  # Tulip's, for the in-process layer's batches
        self.out_dir, self.stem = Path(config.out), layers_stem(config.model, config.label)
        self.env = headline_env(collect_env(
            dataclasses.asdict(config) | {"api_key": "***" if config.api_key else None},
            ["-m", "benchmarks.stack.layers", *redact(argv)], self.servers,
            {"corpus": self.corpus.describe(), "tokenizer": self.counter.describe(), "skipped": self.skipped}))
        self.env["layers"] = self.env.pop("server")  # per layer: its server's facts and verification
        self.env["cost_basis"] = {"gpu_hour_price_usd": config.gpu_hour_price, "gpus": config.gpus}

    def write(self, extra: Sequence[dict[str, Any]] = (), plot: bool = False) -> list[Path]:
        """The file so far (after every suite: a killed run keeps what finished); the plot at the end."""
        return write_layers(self.out_dir, self.stem, self.env, [*self.records, *extra], self.config.model, plot)

    def _open(self, layer: str, config: BenchConfig) -> tuple[Any, Any, dict[str, Any], Any]:
        """(client, spec, server facts, verification face) of one layer; raises when it cannot start."""
        if layer.startswith("ivy-"):
            spec = ClientSpec(config.url, config.model, config.route_style, config.encoding_format,
                              config.api_key, config.timeout_s, self.cpus)
            client = spec.connect()
            face = client if layer == "ivy-text" else IdsFace(lambda s: client.embeddings(s, "float")[0], self.tokenize)
            return client, spec, _closing(client, lambda: http_server(config, client)), face
        if layer in TULIP:
            call = "framed" if layer == "tulip-framed" else config.tulip_call
            tulip = TulipSpec(config.tulip or "", call, config.timeout_s, self.cpus)
            client = tulip.connect()
            server = _closing(client, lambda: tulip_server(config, client))
            info = server["info"]
            self.batch_limits = {k: int(info[k]) for k in ("max_batch_tokens", "max_batch_seqs") if info.get(k)}
            return client, tulip, server, IdsFace(lambda s: client.embed_matrix(s)[0], self.tokenize)
        from benchmarks.stack.inprocess import InprocessLayer  # torch and the engine: only here
        from benchmarks.stack.inprocess_closed import ClosedLoopInprocessLayer

        kind = ClosedLoopInprocessLayer if layer == "inprocess-closed" else InprocessLayer
        engine = kind.load(self.config.model_dir or "", self.config.device, **self.batch_limits)
        server = {"engine": engine.describe(), "max_length": int(engine.engine.info.max_length),
                  "batch_limits_source": "tulip Info" if self.batch_limits else "defaults"}
        return engine, None, server, IdsFace(lambda s: engine.engine.embed(s), self.tokenize)

    def run_layer(self, layer: str) -> None:
        c = self.config
        config = dataclasses.replace(c, input="text" if layer == "ivy-text" else "ids")
        suites = self.suites
        # Every layer's warm-up sees each distinct request 3x, as in-process needs for its graphs (captured,
        # replayed): a layer warmed by fewer read its first step cold against a warm in-process (52549be's texts
        # at 1 x 128, the first step on a fresh stack: +1.18 ms, where its later one-client step read as ids)
        config = dataclasses.replace(config, warmup_requests=max(c.warmup_requests, 3 * c.distinct_inputs))
        if layer in INPROCESS:  # no server to scrape
            config = dataclasses.replace(config, server_metrics=None)
        if layer == "inprocess-closed":  # it differs from inprocess only where several clients send
            suites = tuple(s for s in suites if s == "concurrency")
            if not suites:
                return
        say(f"== layer {layer}")
        try:
            client, spec, server, face = self._open(layer, config)
        except Exception as exc:  # noqa: BLE001 - a layer that cannot start is recorded; the run goes on
            return self._layer_failed(layer, config, f"could not start: {type(exc).__name__}: {exc}")
        self.servers[layer] = server
        with client:
            try:
                server["verification"] = verification(config, face)
            except Exception as exc:  # noqa: BLE001 - VerificationError or the client's error
                return self._layer_failed(layer, config, f"verification: {type(exc).__name__}: {exc}")
            self.max_length = self.max_length or server.get("max_length")
            ctx = SuiteContext(config, client, spec, self.maker, self.max_length,
                               CostBasis(c.gpu_hour_price, c.gpus), tokenize=self.tokenize,
                               replay=getattr(client, "replay", None))
            self.skipped[layer] = ctx.skipped
            done = run_suites(ctx, suites, after_suite=lambda so_far: self.write(tag(layer, so_far)))
        self.records += tag(layer, done)
        self.write()

    def _layer_failed(self, layer: str, config: BenchConfig, error: str) -> None:
        say(f"  layer {layer} failed: {error}")
        self.servers.setdefault(layer, {})["error"] = error
        self.records += tag(layer, [failed_record(s, None, error, input=config.input) for s in self.suites])
        self.write()


def _closing(client: Any, facts: Any) -> dict[str, Any]:
    try:
        return facts()
    except BaseException:
        client.close()
        raise


def tag(layer: str, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"layer": layer, **r} for r in records]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    config = parse(argv)
    try:
        suites, layers = check(config)
        run = LayersRun(config, argv, suites)
    except (ValueError, CorpusError) as exc:
        say(f"error: {exc}")
        return EXIT_CONFIG
    if run.cpus and hasattr(os, "sched_setaffinity"):  # the latency suites' client runs here
        os.sched_setaffinity(0, run.cpus)
    say(f"layers of {config.model}: {', '.join(layers)}; suites: {', '.join(suites)}")
    for layer in layers:
        run.run_layer(layer)
    paths = run.write(plot=True)
    failed = [r for r in run.records if r.get("error")]
    say("wrote " + ", ".join(map(str, paths)) + (f"; {len(failed)} step(s) failed" if failed else ""))
    return EXIT_SERVER if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
