"""`python -m benchmarks.green_contexts`: do CUDA green contexts confine work to their SMs, graphs included?

    python -m benchmarks.green_contexts [--out OUT] [--sms 128,120,112,64,16,8]

What the express lane's SM share (issue 17, rose/green.py) rests on, measured before it is built on:
1. a bf16 GEMM (M = 8192, N = K = 4096: compute-bound, ~0.4 ms on the whole H200) timed on the default stream and
   on a green-context stream of each `--sms` count: confined work should take ~132 / N times as long;
2. a CUDA graph of the same GEMMs captured on an ordinary stream, replayed on a green stream of the smallest
   count (are a graph's kernels confined by the stream they are launched into?), and one captured on that green
   stream and replayed there and on an ordinary stream;
3. the express lane's case in miniature: a small GEMM chain (M = 32, the 0.6B's projections, 28 x 4) timed
   alone, beside the big GEMMs on the default stream, and beside them on a green stream that leaves SMs free.
Each step records its error instead of stopping the run. Writes OUT/green_contexts.json; prints a table last.
What it found is in benchmarks/NOTES.md, "SMs held for the express lane" (a graph is confined by the context
it was captured in, not by the stream it is replayed on; cuBLAS's GEMMs lose more than the SMs held back).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

from benchmarks.gpu_env import collect


def green_stream(num_sms: int, device):
    """(context, stream): a stream whose work runs on `num_sms` SMs (rounded up to the driver's partition
    granularity, 8 on Hopper). torch's beta API: keyword arguments and Stream() from 2.11 on."""
    from torch.cuda.green_contexts import GreenContext

    try:
        ctx = GreenContext.create(num_sms=num_sms, device_id=device.index)
    except TypeError:
        ctx = GreenContext.create(num_sms, device.index)
    return ctx, ctx.Stream()


def timed(fn, stream, reps: int) -> float:
    """Median ms per call of fn() enqueued on `stream` (synchronized per call on that stream)."""
    import torch

    times = []
    with torch.cuda.stream(stream):
        fn()
        stream.synchronize()
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            stream.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def attempt(records: list, name: str, fn) -> None:
    try:
        records.append({"probe": name, **fn()})
    except Exception as e:  # noqa: BLE001 - the probe records what failed and goes on
        records.append({"probe": name, "error": f"{type(e).__name__}: {e}"[:300]})
    print(records[-1], flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--sms", default="128,120,112,64,16,8")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    import torch

    dev = torch.device("cuda", 0)
    total_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    big_a = torch.randn(8192, 4096, device=dev, dtype=torch.bfloat16)
    big_b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    weights = [torch.randn(1024, n, device=dev, dtype=torch.bfloat16) for n in (4096, 1024, 6144, 1024)]
    small_x = torch.randn(32, 1024, device=dev, dtype=torch.bfloat16)

    def big(n: int = 4):
        for _ in range(n):
            big_a @ big_b

    def small_chain():
        for _ in range(28):
            for w in weights:
                (small_x @ w)[:, :1024]

    records: list = []
    ordinary = torch.cuda.Stream(dev)
    attempt(records, "gemm-8192x4096x4096 default", lambda: {"sms": total_sms, "ms": timed(big, ordinary, args.reps)})
    contexts = {}
    for n in [int(s) for s in args.sms.split(",") if s]:
        def one(n=n):
            contexts[n] = green_stream(n, dev)
            return {"sms": n, "ms": timed(big, contexts[n][1], args.reps)}
        attempt(records, f"gemm-8192x4096x4096 green-{n}", one)
    smallest = min(contexts) if contexts else None

    def graph_of(fn, stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            fn()
            stream.synchronize()
            graph.capture_begin()
            fn()
            graph.capture_end()
            stream.synchronize()
        return graph

    if smallest is not None:
        green = contexts[smallest][1]
        attempt(records, "graph ordinary-captured, replayed ordinary", lambda: {
            "ms": timed(graph_of(big, torch.cuda.Stream(dev)).replay, ordinary, args.reps)})
        attempt(records, f"graph ordinary-captured, replayed green-{smallest}", lambda: {
            "sms": smallest, "ms": timed(graph_of(big, torch.cuda.Stream(dev)).replay, green, args.reps)})
        attempt(records, f"graph green-{smallest}-captured, replayed green-{smallest}", lambda: {
            "sms": smallest, "ms": timed(graph_of(big, green).replay, green, args.reps)})
        attempt(records, f"graph green-{smallest}-captured, replayed ordinary", lambda: {
            "ms": timed(graph_of(big, green).replay, ordinary, args.reps)})

    if smallest is not None:
        def ordering():
            """Events across the two contexts: the green stream waits for work of the ordinary one, the host
            for an event recorded on the green stream (what a bulk step switching streams relies on)."""
            green = contexts[smallest][1]
            x = torch.zeros(1 << 20, device=dev)
            with torch.cuda.stream(ordinary):
                big(8)
                x.fill_(1.0)
            green.wait_stream(ordinary)
            with torch.cuda.stream(green):
                y = x.clone()
                big(2)
                y.add_(1.0)
                event = torch.cuda.Event()
                event.record()
            event.synchronize()
            ordinary.wait_stream(green)
            with torch.cuda.stream(ordinary):
                ok = bool((y == 2.0).all().item())
            return {"ordered": ok}
        attempt(records, "events across green and ordinary streams", ordering)

    query_stream = torch.cuda.Stream(dev, priority=-1)
    attempt(records, "small chain alone (priority stream)", lambda: {"ms": timed(small_chain, query_stream, args.reps)})
    for n in [None] + sorted(contexts, reverse=True)[:3]:
        def beside(n=n):
            bulk_stream = ordinary if n is None else contexts[n][1]
            stop, done = threading.Event(), [0]

            def load():
                with torch.cuda.stream(bulk_stream):
                    while not stop.is_set():
                        big(2)
                        bulk_stream.synchronize()
                        done[0] += 2

            thread = threading.Thread(target=load, daemon=True)
            thread.start()
            time.sleep(0.2)
            t0 = time.perf_counter()
            ms = timed(small_chain, query_stream, args.reps * 3)
            rate = done[0] / (time.perf_counter() - t0 + 0.2)
            stop.set()
            thread.join()
            return {"bulk_sms": n or total_sms, "ms": ms, "bulk_gemms_per_s": rate}
        attempt(records, f"small chain beside bulk on {'default' if n is None else f'green-{n}'}", beside)

    env = {**collect(), "torch": torch.__version__, "sms": total_sms}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "green_contexts.json").write_text(json.dumps({"env": env, "records": records}, indent=2))
    print(f"{'probe':58s} {'ms':>8s}  note")
    for r in records:
        note = r.get("error", "") or (f"bulk {r['bulk_gemms_per_s']:.0f} GEMMs/s" if "bulk_gemms_per_s" in r else
                                      f"ordered {r['ordered']}" if "ordered" in r else "")
        print(f"{r['probe']:58s} {r.get('ms', float('nan')):8.3f}  {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
