"""The same requests as a stack run, through ROSE in-process: the denominator of "16 concurrent clients
get at least 80 % of the in-process engine's throughput on the same requests" (DESIGN.md).

    python -m benchmarks.stack --url ... --dump-inputs true --out OUT ...     # writes OUT/<stem>_inputs.json
    python -m benchmarks.stack.inprocess --model-dir DIR --inputs OUT/<stem>_inputs.json \
        [--stack OUT/<stem>.json] [--device cuda] [--out OUT/<stem>_inprocess.json]

For each concurrency level L of the stack run, every client's documents are interleaved in the order L
closed-loop clients would send them (round robin) and the engine embeds them in batches of L documents
(what Tulip forms when L requests are outstanding), with two batches in flight (step() returns a
LazyTensor at once). Tokenization is outside the timing: the engine's throughput is what is compared.
With `--stack`, each level's stack tokens/s is printed beside it with the ratio.

`InprocessLayer` is the same replay as a layer of `python -m benchmarks.stack.layers`: the run's own
requests (token ids), every suite, batched the way Tulip batches them (FCFS, <= max_batch_tokens and
max_batch_seqs per batch, Tulip's own limits from its Info RPC when the run has them) with two batches in
flight. A multi-client step is replayed as rounds: round k holds request k of every client (what L
closed-loop clients have outstanding), the rounds' batches stream two in flight, and a request's latency
is its first batch's submit to its last batch's result (host to host, packing included).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections import deque
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from benchmarks.stack.client import Sample, StackError, cosine_scores
from benchmarks.stack.load import Budget, Request



def interleave(per_client: list[list[dict]]) -> list[str]:
    """One text per request, in the order L closed-loop clients would send them: round robin."""
    out = []
    for i in range(max(map(len, per_client))):
        out.extend(c[i]["texts"][0] for c in per_client if i < len(c))
    return out


def engine_throughput(engine, sequences: list[list[int]], batch_size: int, rounds: int) -> dict:
    """Tokens/s and requests/s embedding `sequences` in batches of `batch_size`, two batches in flight."""
    from rose import Batch

    batches = [Batch.from_sequences(sequences[i:i + batch_size], engine.spec.pooling)
               for i in range(0, len(sequences), batch_size)]
    for b in batches[:4]:  # warm-up: lazy graph capture of the shapes (eager, capture, replay)
        for _ in range(3):
            engine.step(b).result()
    tokens = sum(map(len, sequences))
    best = float("inf")
    for _ in range(rounds):
        start, inflight = time.perf_counter(), []
        for b in batches:
            inflight.append(engine.step(b))
            if len(inflight) == 2:
                inflight.pop(0).result()
        for lazy in inflight:
            lazy.result()
        best = min(best, time.perf_counter() - start)
    return {"batch_size": batch_size, "requests": len(sequences), "tokens": tokens, "seconds": round(best, 6),
            "rps": round(len(sequences) / best, 2), "tokens_per_s": round(tokens / best, 1)}


def engine_error(exc: Exception) -> StackError:
    """An engine failure as the suites' error; bad input (over the model's length) reads as a 400."""
    from rose.meta import BatchError

    status = 400 if isinstance(exc, (BatchError, ValueError)) else None
    return StackError(f"engine: {type(exc).__name__}: {exc}", status)


def pack_groups(lengths: Sequence[int], max_tokens: int, max_seqs: int) -> list[list[int]]:
    """Sequence indices in the batches Tulip's FCFS queue forms: from the head while the tokens fit
    `max_tokens` and the count `max_seqs`; a sequence longer than the budget runs alone."""
    groups: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for i, n in enumerate(lengths):
        if current and (tokens + n > max_tokens or len(current) >= max_seqs):
            groups.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += n
    return groups + [current] if current else groups


class InprocessLayer:
    """The client face (embed_ids, score_route, replay) of rose.Engine in this process."""

    def __init__(self, engine: Any, max_batch_tokens: int = 8192, max_batch_seqs: int = 256) -> None:
        from rose import Batch
        from rose.head import OutputOptions, apply_head

        self.engine, self.max_tokens, self.max_seqs = engine, max_batch_tokens, max_batch_seqs
        self._batch, self._pooling = Batch.from_sequences, engine.spec.pooling
        self._head = lambda rows: apply_head(rows, OutputOptions(), native_int8=engine.spec.native_int8,
                                             default_normalize=engine.spec.normalize)

    @classmethod
    def load(cls, model_dir: str, device: str | None = None, **limits: int) -> "InprocessLayer":
        from rose import Engine

        engine = Engine.from_pretrained(model_dir, device=device)
        engine.warmup()  # what Tulip does before it reports ready: prewarm captures, verified
        return cls(engine, **limits)

    def describe(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.engine.info), "max_batch_tokens": self.max_tokens,
                "max_batch_seqs": self.max_seqs}

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> "InprocessLayer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def embed_ids(self, seqs: Sequence[Sequence[int]], client_tokens: int, score: bool = False) -> Sample:
        try:
            return self._embed_ids(seqs, client_tokens, score)
        except Exception as exc:  # noqa: BLE001 - the engine's error fails the step, as a server's would
            raise engine_error(exc) from exc

    def _embed_ids(self, seqs: Sequence[Sequence[int]], client_tokens: int, score: bool) -> Sample:
        start = time.perf_counter()
        rows = np.empty((len(seqs), self.engine.spec.dimensions), dtype=np.float32)
        inflight: deque = deque()
        for group in pack_groups(list(map(len, seqs)), self.max_tokens, self.max_seqs):
            inflight.append((group, self.engine.step(self._batch([seqs[i] for i in group], self._pooling))))
            if len(inflight) == 2:
                done, lazy = inflight.popleft()
                rows[done] = lazy.result()
        for done, lazy in inflight:
            rows[done] = lazy.result()
        matrix = self._head(rows)
        if score:
            cosine_scores(matrix[0], matrix[1:])
        return Sample(start, time.perf_counter() - start, len(seqs) - score, client_tokens, False)

    def score_route(self, ids: bool) -> str:
        return "rose.Engine in-process, query + documents as one request, + client cosine"

    def _stream(self, rounds: Iterator[list[Request]]) -> list[Sample]:
        """Every round's sequences packed into batches, all batches two in flight; one sample a request."""
        samples: list[Sample] = []
        inflight: deque = deque()

        def finish(lazy: Any, ending: list[tuple[Request, float]]) -> None:
            lazy.result()
            end = time.perf_counter()
            samples.extend(Sample(t0, end - t0, len(r.ids), r.tokens, False) for r, t0 in ending)

        for requests in rounds:
            seqs = [seq for r in requests for seq in r.ids]
            owner = [j for j, r in enumerate(requests) for _ in r.ids]
            groups = pack_groups(list(map(len, seqs)), self.max_tokens, self.max_seqs)
            last = {owner[i]: g for g, group in enumerate(groups) for i in group}
            first: dict[int, float] = {}
            for g, group in enumerate(groups):
                t0 = time.perf_counter()
                lazy = self.engine.step(self._batch([seqs[i] for i in group], self._pooling))
                for i in group:
                    first.setdefault(owner[i], t0)
                inflight.append((lazy, [(requests[j], first[j]) for j in sorted({owner[i] for i in group})
                                        if last[j] == g]))
                if len(inflight) == 2:
                    finish(*inflight.popleft())
        while inflight:
            finish(*inflight.popleft())
        return samples

    def replay(self, suite: str, per_client: list[list[Request]], budget: Budget) -> list[Sample]:
        """A multi-client step as rounds of one request per client; warmed up with every distinct round
        three times (eager, capture, replay), then measured for the budget's duration or request cap."""
        distinct = max(map(len, per_client))

        def round_(k: int) -> list[Request]:
            return [reqs[k % len(reqs)] for reqs in per_client]

        try:
            self._stream(round_(k) for k in range(distinct) for _ in range(3))
        except Exception as exc:  # noqa: BLE001
            raise engine_error(exc) from exc
        deadline = time.perf_counter() + budget.duration_s if budget.duration_s > 0 else float("inf")

        def measured() -> Iterator[list[Request]]:
            k = 0
            while time.perf_counter() < deadline and (budget.max_requests <= 0 or k < budget.max_requests):
                yield round_(k)
                k += 1

        try:
            return self._stream(measured())
        except Exception as exc:  # noqa: BLE001
            raise engine_error(exc) from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--inputs", type=Path, required=True, help="<stem>_inputs.json of a stack run")
    parser.add_argument("--stack", type=Path, default=None, help="that run's <stem>.json, for the ratios")
    parser.add_argument("--device", default=None, help="cuda or cpu; default: cuda when available")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    from rose import Engine

    inputs = json.loads(args.inputs.read_text()).get("concurrency")
    if not inputs:
        raise SystemExit(f"{args.inputs} holds no concurrency inputs (run benchmarks.stack with --dump-inputs true)")
    engine = Engine.from_pretrained(args.model_dir, device=args.device)
    engine.warmup()  # as Tulip starts it (the persistent decoder, where it serves, is on from here)
    stack = {}
    if args.stack is not None:
        stack = {int(r["param"]): r for r in json.loads(args.stack.read_text())["records"]
                 if r["suite"] == "concurrency"}
    rows = []
    for level, per_client in sorted(inputs.items(), key=lambda kv: int(kv[0])):
        texts = interleave(per_client)
        sequences = [e.ids for e in engine.tokenizer.encode_batch(texts)]
        row = {"clients": int(level), **engine_throughput(engine, sequences, int(level), args.rounds)}
        if int(level) in stack:
            row["stack_tokens_per_s"] = stack[int(level)]["tokens_per_s"]
            row["stack_over_inprocess"] = round(stack[int(level)]["tokens_per_s"] / row["tokens_per_s"], 4)
        rows.append(row)
    engine.close()
    result = {"model_dir": args.model_dir, "device": engine.info.device, "rows": rows}
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))
    print(f"{'clients':>7s} {'in-process tok/s':>17s} {'stack tok/s':>12s} {'stack/in-process':>17s}")
    for r in rows:
        ratio = r.get("stack_over_inprocess")
        print(f"{r['clients']:7d} {r['tokens_per_s']:17.0f} {r.get('stack_tokens_per_s', float('nan')):12.0f} "
              f"{'' if ratio is None else f'{ratio:16.1%}'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
