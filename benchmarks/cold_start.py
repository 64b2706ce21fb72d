"""Where an engine's start goes, and what a cold kernel cache adds: one process's start phases, timed.

    python -m benchmarks.cold_start --model-dir DIR [--json FILE]

Phases: importing torch and ROSE, `Engine.from_pretrained` (weights to the device; the kernel manifest's Triton
variants start compiling in worker processes meanwhile, rose.kernel_ahead), waiting for those workers, and
`warmup()` (the persistent decoder's compile and launch where it serves, the probe batch, the kernels' precompile
and the prewarm layouts' capture and verification); and the
Triton kernels compiled (cubins Triton added under TRITON_CACHE_DIR: by the workers, and by the warm-up itself). Over
one empty cache directory: the first run is a fresh replica's start (and records the manifest), the next ones
a fresh replica's with the manifest (the cache emptied again), or a restarted one's (the cache kept).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

T0 = time.perf_counter()


def cache_files() -> int:
    root = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    return sum(1 for p in root.rglob("*.cubin")) if root.exists() else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    before = cache_files()
    import torch

    from rose.engine import Engine

    torch.cuda.init()
    phases = {"import_s": time.perf_counter() - T0}
    t = time.perf_counter()
    engine = Engine.from_pretrained(args.model_dir, graph_manifest=None)
    torch.cuda.synchronize()
    phases["load_s"] = time.perf_counter() - t
    t = time.perf_counter()
    ahead = engine.wait_for_kernels() or {}
    phases["ahead_wait_s"] = time.perf_counter() - t
    after_ahead = cache_files()
    t = time.perf_counter()
    verified = engine.warmup()
    phases["warmup_s"] = time.perf_counter() - t
    phases["total_s"] = time.perf_counter() - T0
    result = {**{k: round(v, 2) for k, v in phases.items()}, "graphs": len(verified),
              "compiled_ahead": after_ahead - before, "compiled_in_warmup": cache_files() - after_ahead,
              "ahead_s": ahead.get("seconds"), "ahead_workers": ahead.get("workers", 0),
              "attention": getattr(getattr(engine.runner, "backend", None), "name", None)}
    engine.close()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print("cold start: " + ", ".join(f"{k} {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
