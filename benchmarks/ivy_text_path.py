"""Ivy's own time for one 128-token request (--tokens) sent as text against the same request sent as token ids.

The ASGI app is called directly (no sockets, no uvicorn) in front of a replica pool that costs nothing: its call
serializes the EmbedRequest (as the framed stream does) and answers a canned row at once, so what differs between
the variants is only Ivy's: the body's parsing, tokenizing against checking ids, packing the ids. 32 distinct
documents of the stack corpus, sent round-robin as the stack benchmark sends them (`input` a list of one text or
of one id list, base64 rows); the tokenizer's word cache is warm after the warm-up. The variants take turns
request by request, so a drift of the machine's speed falls on all of them alike:

    text           a text
    text-pool      the same text tokenized on the worker's tokenizer threads even where the word cache knows it
                   (IVY_TOKENIZE_WARM_INLINE=false; the same as `text` up to --tokenize-inline-chars)
    ids            the same document's token ids

    python -m benchmarks.ivy_text_path                   # median µs a request of each variant
    python -m benchmarks.ivy_text_path --evict-kb 16384  # the CPU's caches cold before each request
    python -m benchmarks.ivy_text_path --profile 30      # and each variant's top functions under cProfile
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import pstats
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import orjson

from benchmarks.stack.corpus import Corpus, DocumentMaker, TokenCounter
from ivy.app import create_app
from ivy.config import IvyConfig
from ivy.gateway import Gateway
from protos import embed_pb2
from rose.head import Encoding
from rose.spec import bundled_model_dir


class ZeroPool:
    """A ReplicaPool stand-in: always serving, never busy, each call answered at once with one row."""

    def __init__(self, dims: int) -> None:
        row = np.full(dims, 1.0 / np.sqrt(dims), dtype="<f4").tobytes()
        self.answer = embed_pb2.EmbedResponse(rows=1, dimensions=dims, encoding=int(Encoding.FLOAT32),
                                              embeddings=row, queue_us=10, inference_us=10, batcher_us=20)
        self.replicas: list = []

    def busy(self) -> bool:
        return False

    def serving(self) -> int:
        return 1

    async def any_serving_now(self, deadline: float | None = None) -> bool:
        return True

    async def call(self, request, tokens: int, deadline: float):
        request.SerializeToString()
        return self.answer


@dataclass
class Variant:
    requests: list[bytes]
    setup: Callable[[Gateway], None]  # before each of its requests


def build_app(model: str = ""):
    """The app and its Gateway (no lifespan: nothing connects), the pool replaced by a ZeroPool; `model`: a folder
    whose tokenizer and limits Ivy takes (the bundled all-MiniLM-L6-v2 when empty)."""
    config = IvyConfig(replicas=("127.0.0.1:1",), health_interval_s=1000, model=model)
    app, gateway = create_app(config), Gateway(config)
    gateway.pool = ZeroPool(gateway.spec.dimensions)
    app.state.gateway = gateway
    return app, gateway


def variants(gateway: Gateway, count: int = 32, tokens: int = 128, model: str = "") -> dict[str, Variant]:
    """`count` documents of `tokens` tokens by the served tokenizer (`model`'s folder; MiniLM's when empty)."""
    if tokens > gateway.spec.max_length:
        raise SystemExit(f"--tokens {tokens} is over the model's max length {gateway.spec.max_length}")
    maker = DocumentMaker(Corpus.load(), TokenCounter(model or bundled_model_dir()))
    docs = maker.documents(random.Random(f"ivy-text-path:{tokens}"), [tokens] * count)
    ids = [gateway.tokenizer.encode(d).ids for d in docs]
    assert all(len(s) == tokens for s in ids)
    model = gateway.model_name

    def body(value) -> bytes:
        return orjson.dumps({"model": model, "input": [value], "encoding_format": "base64"})

    warm_inline = gateway.encoder.warm_inline

    def served(gw: Gateway) -> None:
        gw.encoder.warm_inline = warm_inline

    def pooled(gw: Gateway) -> None:
        gw.encoder.warm_inline = False

    texts = [body(d) for d in docs]
    return {"text": Variant(texts, served), "text-pool": Variant(texts, pooled),
            "ids": Variant([body(s) for s in ids], served)}


async def post(app, body: bytes) -> None:
    """One POST /v1/embeddings through the ASGI app, as uvicorn would call it; fails on anything but 200."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/embeddings", "raw_path": b"/v1/embeddings", "root_path": "",
             "query_string": b"", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000),
             "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    done = asyncio.get_running_loop().create_future()
    sent = iter(({"type": "http.request", "body": body, "more_body": False},))
    status = []

    async def receive():
        message = next(sent, None)
        if message is not None:
            return message
        await done  # the client stays until the answer is out
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            status.append(message["status"])
        elif not message.get("more_body", False) and not done.done():  # cancelled with Ivy's watcher
            done.set_result(None)

    await app(scope, receive, send)
    if status != [200]:
        raise RuntimeError(f"status {status}")


async def compare(app, gateway: Gateway, chosen: dict[str, Variant], rounds: int, per_round: int,
                  evict: np.ndarray | None = None) -> dict[str, list[float]]:
    """Each variant's µs a request, the variants taking turns request by request (in reversed order every other
    round); `evict` is written over before each request (the caches cold, as after the other processes' and the
    kernel's work between two requests of a stack)."""
    for v in chosen.values():  # warm-up: the word cache, every layer's own caches
        v.setup(gateway)
        for body in v.requests * 4:
            await post(app, body)
    times: dict[str, list[float]] = {name: [] for name in chosen}
    clock = time.perf_counter
    for r in range(rounds):
        order = list(chosen) if r % 2 == 0 else list(chosen)[::-1]
        for i in range(per_round):
            for name in order:
                v = chosen[name]
                v.setup(gateway)
                if evict is not None:
                    evict += 1
                start = clock()
                await post(app, v.requests[i % len(v.requests)])
                times[name].append((clock() - start) * 1e6)
    return times


async def profile(app, gateway: Gateway, v: Variant, n: int, top: int) -> str:
    v.setup(gateway)
    prof = cProfile.Profile()
    prof.enable()
    for i in range(n):
        await post(app, v.requests[i % len(v.requests)])
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


async def main_async(args) -> None:
    app, gateway = build_app(args.model)
    chosen = variants(gateway, tokens=args.tokens, model=args.model)
    gc.collect()
    gc.freeze()  # as a served worker's start-up heap (IVY_GC_FREEZE)
    evict = np.zeros(args.evict_kb * 1024 // 8) if args.evict_kb else None
    times = await compare(app, gateway, chosen, args.rounds, args.per_round, evict)
    median = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        print(f"{name:13s} median {median[name]:7.1f} µs  p25 {np.percentile(values, 25):7.1f}  "
              f"p90 {np.percentile(values, 90):7.1f}  ({len(values)} requests)")
    print(f"text - ids {median['text'] - median['ids']:+.1f} µs")
    for name, v in chosen.items() if args.profile else ():
        print(f"\n== {name} under cProfile, {args.profile_requests} requests ==")
        print(await profile(app, gateway, v, args.profile_requests, args.profile))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128, help="tokens a document")
    parser.add_argument("--model", default="", help="a model folder (its tokenizer and limits; 4096 tokens need one "
                        "whose max length allows them: python -m benchmarks.model_zoo qwen3-0.6b DIR)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=1000)
    parser.add_argument("--evict-kb", type=int, default=0, help="KiB written over before each request")
    parser.add_argument("--profile", type=int, default=0, help="print each variant's top N functions by own time")
    parser.add_argument("--profile-requests", type=int, default=5000)
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:
        asyncio.run(main_async(args))
    else:
        uvloop.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
