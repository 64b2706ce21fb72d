"""The stack's own overhead: Ivy + Tulip with an engine that costs nothing, on loopback, in one command.

    python -m benchmarks.overhead [--requests 300] [--concurrency 16] [--duration-s 4] [--ivy-workers 1]

Starts `tulip serve` with benchmarks/zero_engine.py (Info like the bundled all-MiniLM-L6-v2, step() does no
math) and `ivy serve` in front of it as real processes, then measures, each phase after a short warm-up:
  grpc-seq    N sequential Embed calls straight to Tulip (one 128-token sequence each)
  grpc-conc   C concurrent callers straight to Tulip for D seconds
  http-seq    N sequential POST /v1/embeddings through Ivy (one text of 128 tokens, base64)
  http-conc   C concurrent HTTP clients through Ivy for D seconds
  http-health N sequential GET /health (the HTTP floor: uvicorn + the client, no work)
For each: p50/p99 latency, req/s, and CPU milliseconds per request of every process (Tulip, Ivy's workers,
the client), read from /proc, so Ivy's and Tulip's shares are apart even when the cores are shared.
`--profile DIR` also runs py-spy on Tulip and on Ivy's worker during the concurrent HTTP phase; `--warm-cores`
keeps every usable core out of idle meanwhile, as `ivy up --warm-cores` does (ZERO_ENGINE_DEVICE_MS gives the
zero engine a device that takes that long a batch: the stack's threads then wake after idling, as with a GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
import orjson

from benchmarks.stack.corpus import Corpus, TokenCounter
from ivy.http_connection import Connection, HTTPError, Response
from protos import embed_pb2, embed_pb2_grpc
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[1]
FACTORY = f"{REPO / 'benchmarks' / 'zero_engine.py'}:ZeroEngine.from_pretrained"
TICK = os.sysconf("SC_CLK_TCK")
EMBED = "/v1/embeddings"
JSON = {"content-type": "application/json"}


def _ok(response: Response) -> None:
    if response.status_code != 200:
        raise SystemExit(f"the stack answered {response.status_code}: {response.text[:200]}")


WARMUP_PER_CLIENT = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes (threads included), in seconds."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def context_switches(pids: list[int]) -> int:
    """Voluntary + involuntary context switches of every thread of these processes: each cross-thread
    hand-off (a wake-up through a futex, a pipe or a socket) costs at least one."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                for line in (task / "status").read_text().splitlines():
                    if "ctxt_switches" in line:
                        total += int(line.split()[1])
            except OSError:
                continue
    return total


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout.split()
    return [int(p) for p in out]


def text_of_tokens(tokenizer: Tokenizer, n: int, model_dir: str) -> str:
    """A text that tokenizes to exactly n ids (special tokens included): test words of one token each where the
    tokenizer has them (WordPiece), else a prefix of the stack's corpus (a byte-level BPE)."""
    specials = len(tokenizer.encode("", 1 << 30).ids)
    words = ["alpha", "river", "stone", "light", "cloud", "green", "house", "table"]
    text = " ".join(words[i % len(words)] for i in range(n - specials))
    if len(tokenizer.encode(text, 1 << 30).ids) == n:
        return text
    text = TokenCounter(model_dir).cut("\n\n".join(Corpus.load().paragraphs), n)
    if text is None:
        raise SystemExit(f"no prefix of the corpus is exactly {n} tokens for this tokenizer")
    return text


def _shadow_accelerators() -> str:
    """A folder whose uvloop and httptools fail to import, put first on the gateway's path."""
    folder = Path(tempfile.gettempdir()) / "ivy-overhead-no-accelerators"
    for name in ("uvloop", "httptools"):
        (folder / name).mkdir(parents=True, exist_ok=True)
        (folder / name / "__init__.py").write_text(f"raise ImportError('{name} hidden by benchmarks.overhead')\n")
    return str(folder)


class Stack:
    """`tulip serve` (the zero-cost engine unless `factory` names another; "" = ROSE) and `ivy serve` in front
    of it. env: more environment for both; metrics_port: Tulip's /metrics port (0 = off)."""

    def __init__(self, ivy_workers: int, model_dir: str, pure_python: bool = False, factory: str = FACTORY,
                 env: dict[str, str] | None = None, metrics_port: int = 0) -> None:
        self.grpc_port, self.http_port = free_port(), free_port()
        path = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        if pure_python:  # as on a host without uvloop/httptools: uvicorn falls back to asyncio + h11
            path.insert(0, _shadow_accelerators())
        env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(path)}
        self.tulip = subprocess.Popen(
            [sys.executable, "-m", "tulip", "serve", "--port", str(self.grpc_port), "--device", "cpu",
             "--model", model_dir, "--engine-factory", factory, "--metrics-port", str(metrics_port),
             "--log-level", "warning"], env=env, cwd=REPO)
        self.ivy = subprocess.Popen(
            [sys.executable, "-m", "ivy", "serve", "--port", str(self.http_port), "--model", model_dir,
             "--replicas", f"127.0.0.1:{self.grpc_port}", "--workers", str(ivy_workers), "--log-level",
             "warning", "--health-interval-s", "2"], env=env, cwd=REPO)
        self.url = f"http://127.0.0.1:{self.http_port}"

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in (self.tulip, self.ivy):
                if p.poll() is not None:
                    raise SystemExit(f"{p.args[2]} exited with {p.returncode}")
            try:
                if Connection(self.url, timeout_s=1).get("/ready").status_code == 200:
                    return
            except HTTPError:
                pass
            time.sleep(0.2)
        raise SystemExit("the stack did not become ready")

    def pids(self) -> dict[str, list[int]]:
        ivy = [self.ivy.pid, *children(self.ivy.pid)]
        return {"tulip": [self.tulip.pid], "ivy": ivy, "client": [os.getpid()]}

    def stop(self) -> None:
        for p in (self.ivy, self.tulip):
            p.terminate()
        for p in (self.ivy, self.tulip):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


def summarize(name: str, latencies: list[float], wall: float, cpu: dict[str, float],
              switches: dict[str, int]) -> dict:
    lat = np.asarray(latencies) * 1000
    n = len(latencies)
    row = {"phase": name, "requests": n, "p50_ms": float(np.percentile(lat, 50)),
           "p99_ms": float(np.percentile(lat, 99)), "req_per_s": n / wall}
    row.update({f"cpu_ms_per_req_{k}": 1000 * v / n for k, v in cpu.items()})
    row.update({f"switches_per_req_{k}": v / n for k, v in switches.items()})
    return row


def measured(name: str, pids: dict[str, list[int]], run) -> dict:
    before = {k: cpu_seconds(v) for k, v in pids.items()}
    switched = {k: context_switches(v) for k, v in pids.items()}
    start = time.perf_counter()
    result = run()
    wall = time.perf_counter() - start
    extra = 0  # requests outside the timed window (client warm-up) that the servers' CPU also paid for
    if isinstance(result, tuple):
        result, wall, extra = result
    cpu = {k: (cpu_seconds(v) - before[k]) * len(result) / (len(result) + extra) for k, v in pids.items()}
    switches = {k: (context_switches(v) - switched[k]) * len(result) / (len(result) + extra)
                for k, v in pids.items() if k != "client"}
    return summarize(name, latencies=result, wall=wall, cpu=cpu, switches=switches)


def sequential(call, n: int) -> list[float]:
    for _ in range(min(50, n)):
        call()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


async def concurrent(make_call, clients: int, duration: float) -> list[float]:
    stop = time.perf_counter() + duration
    latencies: list[float] = []

    async def client() -> None:
        call = make_call()
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies


def grpc_request(ids: list[int]) -> embed_pb2.EmbedRequest:
    return embed_pb2.EmbedRequest(token_ids=np.asarray(ids, dtype="<i4").tobytes(),
                                  seq_lens=np.asarray([len(ids)], dtype="<i4").tobytes(), encoding=0)


def median_row(rows: list[dict]) -> dict:
    """Each number the median over repeated rounds (the machine's other load moves single rounds)."""
    out = dict(rows[0])
    for key, value in rows[0].items():
        if isinstance(value, (int, float)):
            out[key] = float(np.median([r[key] for r in rows])) if isinstance(value, float) else value
    return out


def run_phases(stack: Stack, args, text: str, ids: list[int]) -> list[dict]:
    pids = stack.pids()
    rows = []
    target = f"127.0.0.1:{stack.grpc_port}"
    request = grpc_request(ids)
    body = {"model": None, "input": [text], "encoding_format": args.encoding}
    body.pop("model")

    with grpc.insecure_channel(target) as channel:
        stub = embed_pb2_grpc.EmbedderStub(channel)
        rows.append(measured("grpc-seq", pids, lambda: sequential(lambda: stub.Embed(request, timeout=10),
                                                                   args.requests)))

    async def grpc_conc() -> list[float]:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = embed_pb2_grpc.EmbedderStub(channel)
            return await concurrent(lambda: (lambda: stub.Embed(request, timeout=10)), args.concurrency,
                                    args.duration_s)

    asyncio.run(grpc_conc())  # warm-up
    rows.append(measured("grpc-conc", pids, lambda: asyncio.run(grpc_conc())))

    client = Connection(stack.url, JSON, timeout_s=30)
    payload = orjson.dumps(body)
    rows.append(measured("http-seq", pids, lambda: sequential(lambda: _ok(client.post(EMBED, payload)),
                                                              args.requests)))
    rows.append(measured("http-health", pids, lambda: sequential(lambda: _ok(client.get("/health")),
                                                                 args.requests)))
    client.close()

    profilers = start_profilers(stack, args.profile, args.duration_s) if args.profile else []
    rows.append(measured("http-conc", {**pids, "client": []},
                         lambda: http_clients(stack.url, body, args.concurrency, args.duration_s)))
    for p in profilers:
        p.wait(60)
    return rows


def _http_client(url: str, body: dict, seconds: float, start: float, out) -> None:
    """One closed-loop client process: a keep-alive connection, one request at a time."""
    client, payload = Connection(url, JSON, timeout_s=30), orjson.dumps(body)
    for _ in range(WARMUP_PER_CLIENT):
        _ok(client.post(EMBED, payload))
    while time.time() < start:
        time.sleep(0.001)
    stop, latencies = time.perf_counter() + seconds, []
    while time.perf_counter() < stop:
        t0 = time.perf_counter()
        _ok(client.post(EMBED, payload))
        latencies.append(time.perf_counter() - t0)
    client.close()
    out.put(latencies)


def http_clients(url: str, body: dict, clients: int, seconds: float) -> tuple[list[float], float, int]:
    """C client processes (as benchmarks.stack does: one Python process cannot drive a sub-millisecond
    server from many clients, its own GIL becomes the limit). Their CPU is not counted (client = [])."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    start = time.time() + 1.0
    procs = [ctx.Process(target=_http_client, args=(url, body, seconds, start, out)) for _ in range(clients)]
    for p in procs:
        p.start()
    latencies = [x for _ in procs for x in out.get(timeout=seconds + 60)]
    for p in procs:
        p.join()
    return latencies, seconds, clients * WARMUP_PER_CLIENT


def start_profilers(stack: Stack, folder: str, seconds: float) -> list[subprocess.Popen]:
    Path(folder).mkdir(parents=True, exist_ok=True)
    workers = [p for p in children(stack.ivy.pid)
               if "resource_tracker" not in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
    targets = {"tulip": stack.tulip.pid, "ivy": (workers or [stack.ivy.pid])[0]}
    beside = Path(sys.executable).with_name("py-spy")  # a venv's py-spy, also when the venv is not on PATH
    spy = str(beside) if beside.exists() else "py-spy"
    return [subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate",
                              "500", "--format", "raw", "--threads", "-o", f"{folder}/{name}.txt"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for name, pid in targets.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="sequential requests per phase")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent clients")
    parser.add_argument("--duration-s", type=float, default=4.0, help="length of each concurrent phase")
    parser.add_argument("--ivy-workers", type=int, default=1, help="uvicorn workers of the gateway")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of all phases; medians are reported")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per request (special tokens included)")
    parser.add_argument("--encoding", default="base64", choices=["base64", "float"])
    parser.add_argument("--model", default="", help="model folder (its tokenizer and Info); default: bundled")
    parser.add_argument("--pure-python", action="store_true",
                        help="hide uvloop and httptools from the gateway (uvicorn then runs asyncio + h11)")
    parser.add_argument("--profile", default="", help="folder for py-spy profiles of the http-conc phase")
    parser.add_argument("--warm-cores", action="store_true",
                        help="keep every usable core out of idle while the phases run, as `ivy up --warm-cores` does "
                             "while its Tulips work (ivy/warm_cores.py's loops, always on here)")
    parser.add_argument("--json", default="", help="write the results here too")
    args = parser.parse_args(argv)
    model_dir = args.model or str(bundled_model_dir())
    tokenizer = Tokenizer(load_spec(model_dir))
    text = text_of_tokens(tokenizer, args.tokens, model_dir)
    ids = tokenizer.encode(text, 1 << 30).ids
    stack = Stack(args.ivy_workers, model_dir, args.pure_python)
    loops: list[subprocess.Popen] = []
    try:
        stack.wait_ready()
        if args.warm_cores:
            from ivy.up_warm_cores import start_loops

            loops = start_loops()
        rounds = [run_phases(stack, args, text, ids) for _ in range(args.repeat)]
        rows = [median_row([r[i] for r in rounds]) for i in range(len(rounds[0]))]
    finally:
        for loop in loops:
            loop.kill()
        stack.stop()
    cols = ["phase", "requests", "p50_ms", "p99_ms", "req_per_s", "cpu_ms_per_req_tulip", "cpu_ms_per_req_ivy",
            "cpu_ms_per_req_client", "switches_per_req_tulip", "switches_per_req_ivy"]
    print(f"{os.cpu_count()} CPUs, ivy workers {args.ivy_workers}, concurrency {args.concurrency}, "
          f"{args.tokens} tokens, {args.encoding}, median of {args.repeat} rounds{', asyncio + h11' if args.pure_python else ''}"
          f"{', warm cores' if args.warm_cores else ''}")
    print("  ".join(f"{c.replace('cpu_ms_per_req_', 'cpu/req ms ').replace('switches_per_req_', 'switch/req '):>16}"
                    for c in cols))
    for row in rows:
        print("  ".join(f"{row[c]:>16.3f}" if isinstance(row[c], float) else f"{row[c]:>16}" for c in cols))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "cpus": os.cpu_count(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
