"""What a torch call costs a thread while another thread runs Python: every torch op gives up the GIL and takes
it back, and the take-back waits for the other thread to let go (up to the switch interval, 5 ms). Tulip's
launcher steps ROSE while its event loop and completer run Python, so each torch call of a step can wait so.

    python -m benchmarks.gil_takebacks [--calls 300] [--busy-share 1.0]

--busy-share: the fraction of the time the other thread runs Python (1.0: always; 0.35: what Tulip's loop
showed at 16 clients), sleeping 0.1 ms between bursts otherwise. Prints µs a call, alone and beside it.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import torch


def calls() -> dict:
    t, o, u = torch.zeros(4096, dtype=torch.uint8), torch.zeros(64, 384), torch.zeros(64, 384)
    return {
        "python (sum of a tuple)": lambda: sum((1, 2)),
        "tensor.shape": lambda: o.shape,
        "view(dtype)": lambda: t.view(torch.float32),
        "slice o[:6, :384]": lambda: o[:6, :384],
        "copy_ 64 x 384": lambda: u.copy_(o),
    }


def per_call_us(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--busy-share", type=float, default=1.0)
    args = p.parse_args()
    stop = threading.Event()
    rest = 1e-4
    burst = 1e-3 if args.busy_share >= 1.0 else rest * args.busy_share / (1 - args.busy_share)

    def other() -> None:
        while not stop.is_set():
            end = time.perf_counter() + burst
            while time.perf_counter() < end:  # Python, holding the GIL
                pass
            if args.busy_share < 1.0:
                time.sleep(rest)

    alone = {name: per_call_us(fn, args.calls) for name, fn in calls().items()}
    thread = threading.Thread(target=other, daemon=True)
    thread.start()
    beside = {name: per_call_us(fn, args.calls) for name, fn in calls().items()}
    stop.set()
    thread.join()
    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}, switch interval "
          f"{sys.getswitchinterval() * 1e3:.1f} ms, the other thread busy {args.busy_share:.0%}")
    print(f"{'call':26s} {'alone µs':>9s} {'beside µs':>10s}")
    for name in alone:
        print(f"{name:26s} {alone[name]:9.1f} {beside[name]:10.1f}")


if __name__ == "__main__":
    main()
