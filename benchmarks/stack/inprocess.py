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
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path



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
