"""How long a sleeping thread or event loop takes to wake on this host, by how long it slept: what each hand-off
of a request (Ivy's loop, Tulip's loop, the completer, the client) pays when the GPU kept it idle ~1 ms.

    python -m benchmarks.wake_latency [--iters 300] [--json FILE]

A waker sleeps the given time, records the clock and wakes the sleeper, which records when it runs (the
difference: the wake's cost). Sleepers: a process blocked on a pipe from another process (`pipe`); an asyncio
loop (uvloop when installed) reading that pipe (`loop-pipe`, as Ivy's and Tulip's loops read sockets); the loop
woken by a thread of its own process with call_soon_threadsafe (`loop-thread`, as Tulip's completer wakes it);
each loop also kept polling by a task that only yields (`+spin`): what a busy-polling loop would save. The thread
rows start the clock once the waker thread holds the GIL again, so its own wait for the GIL (longer beside a
polling loop) is not in them. `--dma-latency` first holds /dev/cpu_dma_latency at 0 (root; the kernel's PM QoS:
no deep idle states) for a second pass. Prints one table last: µs p50 / p90 per sleep length.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import threading
import time
from pathlib import Path

import numpy as np

SLEEPS_US = (20, 200, 1000, 3000)


def _child_waker(go: int, back: int) -> None:
    """In a child process: on each byte from `go` (the sleep in µs), sleep that long, then write the time."""
    while True:
        raw = os.read(go, 4)
        if len(raw) < 4:
            os._exit(0)
        time.sleep(struct.unpack("i", raw)[0] * 1e-6)
        os.write(back, struct.pack("d", time.perf_counter()))


class OtherProcess:
    """A waker in another process, reached by pipes: as Ivy, Tulip and the client reach one another."""

    def __enter__(self):
        go_r, self.go = os.pipe()
        self.back, back_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.go), os.close(self.back)
            _child_waker(go_r, back_w)
        os.close(go_r), os.close(back_w)
        return self

    def __exit__(self, *exc):
        os.close(self.go)
        os.waitpid(self.pid, 0)
        os.close(self.back)


def pipe_wake(sleep_us: int, iters: int) -> list[float]:
    lat = []
    with OtherProcess() as other:
        for _ in range(iters):
            os.write(other.go, struct.pack("i", sleep_us))
            sent = struct.unpack("d", os.read(other.back, 8))[0]
            lat.append((time.perf_counter() - sent) * 1e6)
    return lat


def _run_loop(coro):
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


async def _spinning(spin: bool, body):
    stop = [False]

    async def spinner():
        while not stop[0]:
            await asyncio.sleep(0)

    task = asyncio.ensure_future(spinner()) if spin else None
    try:
        return await body()
    finally:
        stop[0] = True
        if task:
            await task


def loop_reader_wake(sleep_us: int, iters: int, spin: bool) -> list[float]:
    """The loop waits for a pipe from another process (add_reader), as for a socket."""
    async def body():
        loop = asyncio.get_running_loop()
        lat = []
        with OtherProcess() as other:
            for _ in range(iters):
                fut = loop.create_future()
                loop.add_reader(other.back, lambda f=fut: f.done() or f.set_result(os.read(other.back, 8)))
                os.write(other.go, struct.pack("i", sleep_us))
                sent = struct.unpack("d", await fut)[0]
                lat.append((time.perf_counter() - sent) * 1e6)
                loop.remove_reader(other.back)
        return lat

    return _run_loop(_spinning(spin, body))


def loop_thread_wake(sleep_us: int, iters: int, spin: bool) -> list[float]:
    """A thread of this process wakes the loop with call_soon_threadsafe, as Tulip's completer does."""
    async def body():
        loop = asyncio.get_running_loop()
        lat = []
        for _ in range(iters):
            fut = loop.create_future()

            def waker(f=fut):
                time.sleep(sleep_us * 1e-6)
                loop.call_soon_threadsafe(f.set_result, time.perf_counter())

            threading.Thread(target=waker).start()
            sent = await fut
            lat.append((time.perf_counter() - sent) * 1e6)
        return lat

    return _run_loop(_spinning(spin, body))


def measure(iters: int) -> dict[str, dict[int, dict[str, float]]]:
    out: dict[str, dict[int, dict[str, float]]] = {}
    for name, fn in (("pipe", pipe_wake),
                     ("loop-pipe", lambda s, n: loop_reader_wake(s, n, False)),
                     ("loop-pipe+spin", lambda s, n: loop_reader_wake(s, n, True)),
                     ("loop-thread", lambda s, n: loop_thread_wake(s, n, False)),
                     ("loop-thread+spin", lambda s, n: loop_thread_wake(s, n, True))):
        out[name] = {}
        for sleep_us in SLEEPS_US:
            v = np.array(fn(sleep_us, iters)[10:])
            out[name][sleep_us] = {"p50_us": float(np.median(v)), "p90_us": float(np.percentile(v, 90))}
    return out


def host_idle() -> dict[str, str]:
    info = {}
    for key, path in (("cpuidle_driver", "/sys/devices/system/cpu/cpuidle/current_driver"),
                      ("cpuidle_governor", "/sys/devices/system/cpu/cpuidle/current_governor_ro"),
                      ("cpufreq_governor", "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")):
        try:
            info[key] = Path(path).read_text().strip()
        except OSError:
            info[key] = "n/a"
    return info


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--dma-latency", action="store_true")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    result = {"host": host_idle(), "runs": {"default": measure(args.iters)}}
    if args.dma_latency:
        try:
            fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
            os.write(fd, struct.pack("i", 0))
            result["runs"]["dma_latency_0"] = measure(args.iters)
            os.close(fd)
        except OSError as exc:
            result["runs"]["dma_latency_0"] = {"error": str(exc)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(f"wake latency, µs p50 / p90, by how long the sleeper slept; host {result['host']}")
    print(f"{'run':15s} {'sleeper':17s}" + "".join(f"{s:>16d}" for s in SLEEPS_US))
    for run, table in result["runs"].items():
        if "error" in table:
            print(f"{run:15s} {table['error']}")
            continue
        for name, row in table.items():
            cells = "".join(f"{row[s]['p50_us']:8.1f} /{row[s]['p90_us']:6.1f}" for s in SLEEPS_US)
            print(f"{run:15s} {name:17s}" + cells)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
