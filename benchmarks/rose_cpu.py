"""ROSE against sentence-transformers on a CPU, same machine, model and texts (DESIGN.md: "on a CPU, ROSE
must not be slower than sentence-transformers").

    python -m benchmarks.rose_cpu [--model DIR] [--out benchmarks/results] [--threads N]

Texts in, embeddings out, tokenization included on both sides (what a user of either waits for):
- bs1-128: one 128-token text per call, p50/p99;
- docs-100: 100 documents of 16..512 tokens (lognormal, median 128; benchmarks.stack.corpus), one call;
- batch-32x128: 32 texts of 128 tokens, one call.
sentence-transformers runs `encode(texts, batch_size=32)` (its default), ROSE `Engine.embed` on the
tokenizer's ids in float32 (its CPU default). Both get the same torch thread count. Alternating rounds,
so drift on a shared machine hits both alike. Writes rose_cpu.json and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import gpu_env
from benchmarks.stack.corpus import documents


def _timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder; default: the bundled all-MiniLM-L6-v2")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--suites", default="bs1-128,batch-32x128,docs-100", help="which of the three to run")
    parser.add_argument("--tag", default="", help="suffix of the result file (rose_cpu<TAG>.json)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from sentence_transformers import SentenceTransformer

    from rose import Engine
    from rose.spec import bundled_model_dir

    model_dir = str(args.model or bundled_model_dir())
    engine = Engine.from_pretrained(model_dir, device="cpu")
    st = SentenceTransformer(model_dir, device="cpu")
    suites = {"bs1-128": documents(model_dir, 8, seed=1, mu=np.log(128), sigma=0.0, lo=128, hi=128),
              "batch-32x128": documents(model_dir, 32, seed=2, mu=np.log(128), sigma=0.0, lo=128, hi=128),
              "docs-100": documents(model_dir, 100, seed=3)}
    suites = {k: v for k, v in suites.items() if k in args.suites.split(",")}

    def rose(texts: list[str]) -> np.ndarray:
        ids = [e.ids for e in engine.tokenizer.encode_batch(texts)]
        return engine.embed(ids)

    def sbert(texts: list[str]) -> np.ndarray:
        return st.encode(texts, batch_size=32, convert_to_numpy=True)

    records = []
    for suite, texts in suites.items():
        a, b = rose(texts), sbert(texts)  # warm-up, and the two must agree
        cos = float(np.min(np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))
        calls = ([[t] for t in texts] if suite == "bs1-128" else [texts])
        tokens = sum(len(e.ids) for e in engine.tokenizer.encode_batch(texts)) // len(calls)
        times: dict[str, list[float]] = {"rose": [], "sentence-transformers": []}
        for _ in range(args.rounds):
            for name, fn in (("rose", rose), ("sentence-transformers", sbert)):
                for call in calls:
                    times[name] += _timed(lambda: fn(call), 1)
        for name, ts in times.items():
            ms = np.asarray(ts) * 1e3
            p50 = float(np.percentile(ms, 50))
            records.append({"suite": suite, "impl": name, "p50_ms": round(p50, 3),
                            "p99_ms": round(float(np.percentile(ms, 99)), 3),
                            "tokens_per_s": round(tokens / (p50 / 1e3), 1), "min_cosine_vs_st": round(cos, 6)})
            print(f"  {suite:13s} {name:22s} p50 {p50:9.2f} ms", flush=True)
    env = {**gpu_env.collect(), "torch_threads": torch.get_num_threads(), "model": model_dir}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rose_cpu{args.tag}.json").write_text(json.dumps({"env": env, "records": records}, indent=1))
    print(f"\n{'suite':13s} {'impl':22s} {'p50 ms':>9s} {'p99 ms':>9s} {'tok/s':>9s} {'ratio':>6s}")
    for r in records:
        st_p50 = next(x["p50_ms"] for x in records if x["suite"] == r["suite"] and x["impl"] != "rose")
        print(f"{r['suite']:13s} {r['impl']:22s} {r['p50_ms']:9.2f} {r['p99_ms']:9.2f} {r['tokens_per_s']:9.0f} "
              f"{st_p50 / r['p50_ms']:6.2f}")


if __name__ == "__main__":
    main()
