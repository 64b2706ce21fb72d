"""`python -m benchmarks.stack.index`: `ivy index` through `ivy up` against the engine in-process (issue 18).

    python -m benchmarks.stack.index --model-dir DIR --out OUT [--documents 200000] [--budget-s 240]

In one run, on the same synthetic documents (benchmarks/stack/index_corpus.py: lognormal lengths from the
bundled corpus, written as JSONL under --work):
1. in-process: the engine as Tulip builds it, the documents batched as ivy index and Tulip would
   (index_inprocess.py), two batches in flight: documents/s and tokens/s, the denominator;
2. `ivy index docs.jsonl --url` against a stack this command starts with `ivy up` (after an untimed
   `ivy index` of the first window: graph captures, connections), timed by the job's own summary;
3. kill and resume: `ivy index` of the first half of the documents, SIGKILLed once half its shards are
   committed, then the same command with `--resume`; the output must hold every id exactly once.
The document count is sized to --budget-s (default $BUDGET; 0 = no limit): after the in-process rate is
measured on the first window, the count is cut (printed) when the run would not fit, assuming the stack
reaches --assumed-share of it. Writes OUT/index_<model>.json and prints the table last: the stack's share
of the in-process throughput (target >= 90 %) and the kill/resume check. Exit codes: 0 done, 2 bad
configuration, 4 a step failed or the check did not hold (the file is written all the same).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from benchmarks.stack.__main__ import EXIT_CONFIG, EXIT_SERVER
from benchmarks.stack.config import _f
from benchmarks.stack.index_corpus import exactly_once, make_documents, write_jsonl
from benchmarks.stack.index_job import run_ivy_index
from benchmarks.stack.index_report import table, verdicts
from benchmarks.stack.layers_report import headline_env
from benchmarks.stack.report import collect_env
from benchmarks.stack.up_stack import StackFailed, UpStack, UpStackFields, raise_on_sigterm
from rose.flags import add_config_arguments, config_from_args
from rose.spec import bundled_model_dir, load_spec

ENV_PREFIX = "BENCH_INDEX"


@dataclass(frozen=True)
class IndexBenchConfig(UpStackFields):
    model_dir: str = _f("", "model folder served by `ivy up` and loaded in-process; empty = the bundled MiniLM")
    model: str = _f("", "name in the result file, index_<model>.json; empty = the folder's name")
    out: str = _f("benchmarks/results", "folder for index_<model>.json")
    work: str = _f("/tmp/index_bench", "folder for the JSONL inputs, ivy index's outputs and the logs")
    documents: int = _f(200_000, "documents to embed (cut to fit --budget-s, printed)")
    budget_s: float = _f(0.0, "seconds the whole run may take; 0 = $BUDGET when set, else no limit")
    assumed_share: float = _f(0.6, "sizing: the share of the in-process rate assumed for the stack")
    stack_start_s: float = _f(40.0, "sizing: seconds assumed for `ivy up` to become ready")
    seed: int = _f(0, "seed of the documents")
    doc_max_tokens: int = _f(512, "longest document in tokens (clip; also below the model's max length)")
    batch_size: int = _f(64, "ivy index --batch-size")
    concurrency: int = _f(16, "ivy index --concurrency")
    sort_window: int = _f(10_000, "ivy index --sort-window (documents per shard and per sorted window)")
    kill_resume: bool = _f(True, "run the SIGKILL and --resume check")
    device: str = _f("", "in-process device (cpu, cuda); empty = Tulip's auto")


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class IndexRun:
    def __init__(self, config: IndexBenchConfig, argv: Sequence[str]) -> None:
        self.config, self.t0 = config, time.monotonic()
        self.model_dir = config.model_dir or str(bundled_model_dir())
        spec_id = load_spec(Path(self.model_dir)).model_id.rsplit("/", 1)[-1]
        self.name = config.model or (Path(self.model_dir).name if config.model_dir else spec_id)
        self.work = Path(config.work)
        self.budget = config.budget_s or float(os.environ.get("BUDGET") or 0)
        self.result: dict[str, Any] = {"requested_documents": config.documents, "budget_s": self.budget or None}
        self.env = headline_env(collect_env(dataclasses.asdict(config), ["-m", "benchmarks.stack.index", *argv],
                                            {}, {}))
        self.env["model"], self.env["model_dir"] = self.name, self.model_dir
        self.failed: list[str] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.budget - self.elapsed() if self.budget else 3600.0

    def path(self, name: str) -> Path:
        return self.work / name

    def inprocess(self) -> list[str]:
        """Documents made, the in-process pass measured (sized to the budget); the texts kept."""
        from benchmarks.stack.index_inprocess import EngineRun

        c = self.config
        hi = min(c.doc_max_tokens, load_spec(Path(self.model_dir)).max_length - 8)
        docs = make_documents(self.model_dir, c.documents, c.seed, hi=hi)
        self.env["inputs"] = docs.describe
        run = EngineRun.load(self.model_dir, c.device)
        try:
            texts = docs.texts
            seqs = run.tokenize(texts)
            first = run.batches(texts[: c.sort_window], seqs, c.sort_window)
            run.run(seqs, first)  # untimed: the window's graph layouts captured
            probe = run.run(seqs, first)
            texts = self.sized(texts, probe["documents_per_s"])
            say(f"in-process: {len(texts):,} documents ({sum(map(len, seqs[: len(texts)])):,} tokens)")
            self.result["inprocess"] = {**run.run(seqs, run.batches(texts, seqs, c.sort_window)),
                                        "engine": run.describe(), "probe": probe}
            say(f"   {self.result['inprocess']['documents_per_s']:,.0f} docs/s, "
                f"{self.result['inprocess']['tokens_per_s']:,.0f} tokens/s")
        finally:
            run.close()
        return texts

    def sized(self, texts: list[str], rate: float) -> list[str]:
        """The documents that fit what is left of the budget: an in-process pass, the stack's (at the
        assumed share of that rate) and the kill/resume half, plus the stack's start and ~20 s of processes."""
        c = self.config
        if not self.budget or rate <= 0:
            return texts
        per_doc = 1 / rate + (1 + 0.5 * c.kill_resume) / (rate * c.assumed_share)
        fits = int((self.left() - c.stack_start_s - 20) / per_doc)
        if fits >= len(texts):
            return texts
        count = max(min(len(texts), 2 * c.sort_window), fits // c.sort_window * c.sort_window)
        note = (f"scaled from {len(texts):,} to {count:,} documents: at {rate:,.0f} docs/s in-process and an "
                f"assumed {c.assumed_share:.0%} of it through the stack, {len(texts):,} would not fit the "
                f"{self.left():.0f} s left of the {self.budget:.0f} s budget")
        say("NOTE: " + note)
        self.result["scaled_note"] = note
        return texts[:count]

    def index(self, source: Path, output: Path, *extra: str, kill_at_shards: int = 0) -> dict[str, Any]:
        c = self.config
        flags = ["--url", self.url, "--batch-size", str(c.batch_size), "--concurrency", str(c.concurrency),
                 "--sort-window", str(c.sort_window), *extra]
        return run_ivy_index(source, output, flags, self.path("ivy_index.log"), max(30.0, self.left()),
                             kill_at_shards)

    def stack(self, texts: list[str]) -> None:
        c = self.config
        count, half = len(texts), len(texts) // 2
        docs, warm = write_jsonl(self.path("docs.jsonl"), texts), write_jsonl(self.path("warm.jsonl"), texts,
                                                                              c.sort_window)
        stack = UpStack.of(self.model_dir, self.path("up.log"), c)
        say("== ivy up")
        try:
            stack.start()
            self.url, self.result["stack_ready_s"] = stack.url, stack.ready_s
            say(f"   ready after {stack.ready_s} s; warm-up: ivy index of the first window")
            self.result["warmup"] = self.index(warm, self.fresh("out_warm"))
            say(f"== ivy index of {count:,} documents")
            run = self.result["stack"] = self.index(docs, self.fresh("out_full"))
            run["check"] = exactly_once(self.path("out_full"), count)
            if "summary" in run:
                s = run["summary"]
                say(f"   {s['documents_per_s']:,.0f} docs/s, {s['tokens_per_s']:,.0f} tokens/s; every id once: "
                    f"{run['check']['ok']}")
            else:
                self.failed.append(f"ivy index failed (exit {run['exit_code']}); see {self.path('ivy_index.log')}")
            if c.kill_resume:
                self.kill_resume(texts, half)
        except (StackFailed, OSError, TimeoutError) as exc:
            self.failed.append(f"{type(exc).__name__}: {exc}")
            say(f"   {self.failed[-1]}")
        finally:
            self.result["stack_exit_code"] = stack.stop()

    def kill_resume(self, texts: list[str], half: int) -> None:
        c = self.config
        source, output = write_jsonl(self.path("half.jsonl"), texts, half), self.fresh("out_resume")
        windows = -(-half // c.sort_window)
        at = max(1, windows // 2)
        say(f"== kill and resume: ivy index of {half:,} documents ({windows} shards), SIGKILL after {at}")
        killed = self.index(source, output, kill_at_shards=at)
        resumed = self.index(source, output, "--resume")
        check = exactly_once(output, half)
        self.result["kill_resume"] = {"documents": half, "shards": windows, "kill": killed, "resume": resumed,
                                      "check": check}
        say(f"   killed: {killed.get('killed', False)} at {killed.get('shards_at_kill')} shards; resumed exit "
            f"{resumed['exit_code']}; every id once: {check['ok']}")

    def fresh(self, name: str) -> Path:
        import shutil

        shutil.rmtree(self.path(name), ignore_errors=True)
        return self.path(name)

    def write(self) -> Path:
        self.result.update(verdicts(self.result))
        self.result["wall_s"] = round(self.elapsed(), 1)
        out = Path(self.config.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"index_{self.name}.json"
        path.write_text(json.dumps({"env": self.env, **self.result, "failed": self.failed}, indent=2, default=str))
        return path


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stack.index", description=__doc__.split("\n")[0])
    add_config_arguments(parser, IndexBenchConfig, ENV_PREFIX)
    config = config_from_args(IndexBenchConfig, parser.parse_args(argv), ENV_PREFIX)
    if config.documents < 2 or config.sort_window < 1 or not 0 < config.assumed_share <= 1:
        say("error: --documents must be at least 2, --sort-window at least 1, --assumed-share in (0, 1]")
        return EXIT_CONFIG
    os.environ.setdefault("TULIP_GRAPH_MANIFEST", "off")  # neither engine prewarms what the other recorded
    run = IndexRun(config, argv)
    raise_on_sigterm()  # a timeout: the stack stopped, ivy index killed, the file written
    try:
        texts = run.inprocess()
        run.stack(texts)
    except Exception as exc:  # noqa: BLE001 - recorded; the file is written all the same
        run.failed.append(f"{type(exc).__name__}: {exc}")
        say(f"failed: {run.failed[-1]}")
    path = run.write()
    say(f"wrote {path}")
    print(table(run.result, run.name), flush=True)
    return EXIT_SERVER if run.failed or not run.result.get("checks_ok") else 0


if __name__ == "__main__":
    raise SystemExit(main())
