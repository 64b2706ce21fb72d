"""ROSE on the GPU against the peers, one lever at a time (issue 4). Run on the H200:

    python -m benchmarks.rose_gpu --out benchmarks/results [--models qwen3-0.6b,qwen3-4b,minilm-l6] [--quick]
    python -m benchmarks.rose_gpu --models modernbert-base,mpnet-base,distilbert-base --tag _encoders

The encoder families of issue 16 (and MiniLM) run bs1-128 and docs-100 only; so do the cross-encoders,
SPLADE and BGE-M3 (HF: benchmarks.hf_heads; ROSE returns its native row: score, vocabulary row, dense + heads).
    python -m benchmarks.rose_gpu --models ms-marco-minilm-l6,bge-reranker-v2-m3,splade-cocondenser,bge-m3 --tag _heads
    python -m benchmarks.rose_gpu --models gte-base-en-v1.5,nomic-embed-text-v1.5 --variants rose-eager,rose-graphs \
        --tag _remote                                          # ROSE only: no HF class (benchmarks/model_zoo_remote.py)
    python -m benchmarks.rose_gpu --out benchmarks/results --tag _decoders \
        --models embeddinggemma-300m,gte-qwen2-1.5b,e5-mistral-7b --variants hf-eager,rose-eager,rose-graphs

Host->host latency (token ids on the CPU in, the embedding on the CPU out), in one run:
hf-eager, hf-compile (torch.compile reduce-overhead; 0.6B at 128/512 tokens only, its compile time
reported), rose-eager, rose-graphs, rose-graphs-overlap (two batches in flight), and with --profiles
rose-best (graphs, attention per token bucket from the A/B's serving profile). Random bf16 weights of
the real configs (benchmarks.model_zoo). Writes rose_gpu.json and saturation.png; prints a table last.
MiniLM and the decoder embedders run bs1-128 and docs-100 only. HF's pooling here is mean or last token
and normalize; EmbeddingGemma's two Dense layers after it (two small GEMMs) are left out of the HF side.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import gpu_env, hf_heads
from benchmarks.model_zoo import BERT_LIKE, DECODER_CONFIGS, HEAD_MODELS, make_folder
from benchmarks.model_zoo_remote import REMOTE_MODELS
from rose.attention.profile import PROFILE_NAME

VARIANTS = ("hf-eager", "hf-compile", "rose-eager", "rose-graphs", "rose-graphs-overlap", "saturation",
            "rose-best")
SUITES = {  # name -> list of sequence lengths in one request
    "bs1-128": [128], "bs1-512": [512], "bs1-4096": [4096], "score-50x512": [512] * 50,
}
SHORT_RUN = {*BERT_LIKE, *DECODER_CONFIGS, *HEAD_MODELS, *REMOTE_MODELS}  # timed on bs1-128 (and docs-100) only


DEVICE = "cuda"  # --device cpu: a smoke run of this script where there is no GPU (numbers meaningless)
ATTENTION = "auto"  # --attention: the backend of rose-eager / rose-graphs
ONLY_SUITES: tuple[str, ...] = ()  # --suites: these alone (bs1-N for any N), else the standard set and docs-100


def empty_cache() -> None:
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def docs_100(max_len: int, seed: int = 0) -> list[int]:
    """100 documents, lognormal lengths (median 128 tokens, sigma 0.8) clipped to 16..512."""
    rng = np.random.default_rng(seed)
    return [int(x) for x in np.clip(rng.lognormal(np.log(128), 0.8, 100), 16, min(512, max_len))]


def make_ids(lengths: list[int], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1000, 30000, size=n).astype(np.int32) for n in lengths]


def percentiles(times_s: list[float]) -> tuple[float, float]:
    ms = np.asarray(times_s) * 1e3
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def time_serial(fn, inputs, iters: int, warmup: int) -> list[float]:
    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    out = []
    for i in range(iters):
        t0 = time.perf_counter()
        fn(inputs[i % len(inputs)])
        out.append(time.perf_counter() - t0)
    return out


# -- peers: HF transformers ---------------------------------------------------------------------
def hf_runner(model_dir: Path, pooling: str, compile_mode: str | None):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, torch_dtype=torch.bfloat16).to(DEVICE).eval()
    if compile_mode:
        model = torch.compile(model, mode=compile_mode)

    @torch.inference_mode()
    def run(seqs: list[np.ndarray]) -> np.ndarray:
        ids_t, mask_t = hf_heads.pad(seqs, DEVICE)
        hidden = model(input_ids=ids_t, attention_mask=mask_t).last_hidden_state
        if pooling == "last":
            pooled = hidden[torch.arange(len(seqs), device=DEVICE), mask_t.sum(1) - 1]
        elif pooling == "cls":
            pooled = hidden[:, 0]
        else:
            m = mask_t[..., None].to(hidden.dtype)
            pooled = (hidden * m).sum(1) / m.sum(1)
        return torch.nn.functional.normalize(pooled.float(), dim=-1).cpu().numpy()

    return run


def hf_baseline(model_dir: Path, spec, compile_mode: str | None):
    """The transformers model the folder holds: a cross-encoder's score, SPLADE's vocabulary row, else the
    pooled hidden state (BGE-M3: its dense CLS output)."""
    if spec.score_head is not None:
        return hf_heads.hf_cross_runner(model_dir, spec.score_head, DEVICE)
    if spec.retrieval is not None and spec.retrieval.kind == "splade":
        return hf_heads.hf_splade_runner(model_dir, DEVICE)
    return hf_runner(model_dir, spec.pooling, compile_mode)


# -- ROSE ----------------------------------------------------------------------------------------
def rose_engine(model_dir: Path, graphs: bool, attention: str = "auto"):
    from rose import Batch, Engine

    t0 = time.perf_counter()
    engine = Engine.from_pretrained(model_dir, device=DEVICE, dtype="bfloat16", cuda_graphs=graphs,
                                    pinned_cap_bytes=1 << 30, attention=attention)
    engine.warmup()
    ready_s = time.perf_counter() - t0

    def run(seqs):
        return engine.step(Batch.from_sequences(seqs, engine.spec.pooling)).result()

    return engine, run, ready_s


def time_overlap(engine, inputs, iters: int, warmup: int) -> tuple[list[float], float]:
    """Two batches in flight: launch n+1 before collecting n. Returns per-batch latencies and wall time."""
    from rose import Batch

    batches = [Batch.from_sequences(s, engine.spec.pooling) for s in inputs]
    for i in range(warmup):
        engine.step(batches[i % len(batches)]).result()
    lat, inflight = [], []
    t_start = time.perf_counter()
    for i in range(iters):
        inflight.append((time.perf_counter(), engine.step(batches[i % len(batches)])))
        if len(inflight) == 2:
            t0, lazy = inflight.pop(0)
            lazy.result()
            lat.append(time.perf_counter() - t0)
    for t0, lazy in inflight:
        lazy.result()
        lat.append(time.perf_counter() - t0)
    return lat, time.perf_counter() - t_start


def best_profile(profiles: Path, name: str, causal: bool) -> Path:
    """The A/B's profile for this model: profiles/<name>-causal/ for a causal model when measured, else
    profiles/<name>/ (bidirectional shapes; the kernels' ranking was the same both ways on the H200)."""
    for folder in ([f"{name}-causal"] if causal else []) + [name]:
        path = profiles / folder / PROFILE_NAME
        if path.is_file():
            return path
    raise SystemExit(f"no serving profile for {name} under {profiles} (run benchmarks.attention_ab first)")


def bench_model(name: str, root: Path, quick: bool, records: list, saturation: list,
                compile_suites: list[str], variants: set[str], profiles: Path | None = None) -> None:
    model_dir = make_folder(name, root / name, "bfloat16")
    from rose.spec import load_spec

    spec = load_spec(model_dir)
    (model_dir / PROFILE_NAME).unlink(missing_ok=True)  # rose-eager/-graphs: the default attention
    max_len = spec.max_length
    suites = {k: v for k, v in SUITES.items() if max(v) <= max_len and (name not in SHORT_RUN or k == "bs1-128")}
    suites["docs-100"] = docs_100(max_len)
    if ONLY_SUITES:
        suites = {k: suites[k] if k in suites else [int(k.split("-", 1)[1])] for k in ONLY_SUITES}
    iters = 10 if quick else 40
    inputs = {k: [make_ids(v, seed) for seed in range(4)] for k, v in suites.items()}

    def record(suite, variant, times, tokens, wall=None, **extra):
        p50, p99 = percentiles(times)
        tps = tokens * len(times) / wall if wall else tokens / (p50 / 1e3)
        records.append({"model": name, "suite": suite, "variant": variant, "p50_ms": round(p50, 4),
                        "p99_ms": round(p99, 4), "tokens_per_s": round(tps, 1), **extra})
        print(f"  {name:11s} {suite:13s} {variant:20s} p50 {p50:9.3f} ms  p99 {p99:9.3f} ms  {tps/1e3:9.1f} k tok/s",
              flush=True)

    for compile_mode in (None, "reduce-overhead"):
        if (compile_mode and name != "qwen3-0.6b") or ("hf-compile" if compile_mode else "hf-eager") not in variants:
            continue
        if name in REMOTE_MODELS:
            print(f"  {name}: no HF baseline (transformers has no class for it; its HF code is remote code)",
                  flush=True)
            continue
        run = hf_baseline(model_dir, spec, compile_mode)
        variant = "hf-compile" if compile_mode else "hf-eager"
        for suite, batches in inputs.items():
            if compile_mode and suite not in compile_suites:
                continue
            tc = time.perf_counter()
            run(batches[0])
            first_s = time.perf_counter() - tc
            times = time_serial(run, batches, iters, 3)
            record(suite, variant, times, sum(suites[suite]), first_call_s=round(first_s, 2))
        del run
        empty_cache()

    for graphs in (False, True):
        variant = "rose-graphs" if graphs else "rose-eager"
        if variant not in variants:
            continue
        engine, run, ready_s = rose_engine(model_dir, graphs, ATTENTION)
        for suite, batches in inputs.items():
            tc = time.perf_counter()
            run(batches[0])  # first occurrence: eager at the padded shape (lazy capture's warm-up)
            cold_ms = (time.perf_counter() - tc) * 1e3
            times = time_serial(run, batches, iters, 3)
            extra = {"cold_first_ms": round(cold_ms, 2), "attention": engine.info.attention_backend,
                     "persistent_tokens": engine.stats()["persistent_decoder_tokens"]}  # 0: the layers served
            if name == "qwen3-0.6b":
                extra["ready_s"] = round(ready_s, 2)
            record(suite, variant, times, sum(suites[suite]), **extra)
            if graphs and "rose-graphs-overlap" in variants:
                lat, wall = time_overlap(engine, batches, iters, 3)
                record(suite, "rose-graphs-overlap", lat, sum(suites[suite]), wall=wall)
        if graphs and name in ("qwen3-0.6b", "minilm-l6") and "saturation" in variants:
            for seqs in (1, 4, 16, 64):
                for tokens in (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384):
                    if tokens < seqs or -(-tokens // seqs) > max_len:
                        continue
                    lengths = [tokens // seqs + (1 if i < tokens % seqs else 0) for i in range(seqs)]
                    batch = [make_ids(lengths, s) for s in range(2)]
                    times = time_serial(run, batch, 5 if quick else 15, 3)
                    p50, _ = percentiles(times)
                    saturation.append({"model": name, "seqs": seqs, "tokens": tokens, "p50_ms": round(p50, 4),
                                       "tokens_per_s": round(tokens / (p50 / 1e3), 1)})
        stats = engine.stats()
        print(f"  {name} {variant}: graphs {stats.get('graphs_captured')}, capture "
              f"{stats.get('graph_capture_seconds', 0):.2f} s", flush=True)
        engine.close()
        del engine, run
        empty_cache()
    if profiles is not None and "rose-best" in variants:
        profile = best_profile(profiles, name, spec.causal)
        shutil.copy(profile, model_dir / PROFILE_NAME)  # attention "auto" reads it from beside the model
        engine, run, _ = rose_engine(model_dir, DEVICE == "cuda")
        print(f"  {name} rose-best: attention {engine.info.attention_backend} from {profile}",
              flush=True)
        for suite, batches in inputs.items():
            run(batches[0])
            record(suite, "rose-best", time_serial(run, batches, iters, 3), sum(suites[suite]),
                   profile=f"{profile.parent.name}/{PROFILE_NAME}")
        engine.close()
        del engine, run
        (model_dir / PROFILE_NAME).unlink(missing_ok=True)
        empty_cache()


def plot_saturation(saturation: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in saturation})
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        for seqs in sorted({r["seqs"] for r in saturation if r["model"] == model}):
            rows = [r for r in saturation if r["model"] == model and r["seqs"] == seqs]
            ax.plot([r["tokens"] for r in rows], [r["p50_ms"] for r in rows], marker="o", label=f"{seqs} seqs")
        ax.set(xscale="log", yscale="log", xlabel="total tokens in the batch", ylabel="p50 latency (ms)",
               title=f"{model}: latency vs tokens (ROSE graphs, H200)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--models", default="qwen3-0.6b,minilm-l6,qwen3-4b")
    parser.add_argument("--root", type=Path, default=Path("/tmp/rose-models"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tag", default="", help="suffix for the output file names")
    parser.add_argument("--compile-suites", default="bs1-128,bs1-512",
                        help="suites timed with HF + torch.compile (each new shape recompiles: ~50 s each)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"what to run, of {','.join(VARIANTS)}")
    parser.add_argument("--profiles", type=Path, default=None,
                        help="serving profiles from benchmarks.attention_ab (DIR/<model>[-causal]/rose_profile.json):"
                             " adds the rose-best variant")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: smoke-test the script")
    parser.add_argument("--attention", default="auto",
                        help="ROSE's attention backend for rose-eager / rose-graphs (rose-best: the profile's)")
    parser.add_argument("--suites", default="",
                        help="only these suites, comma-separated (bs1-N for any N tokens); default: the standard set")
    args = parser.parse_args()
    global DEVICE, ATTENTION, ONLY_SUITES
    DEVICE, ATTENTION = args.device, args.attention
    ONLY_SUITES = tuple(s for s in args.suites.split(",") if s)
    if any(s not in SUITES and s != "docs-100" and not s.startswith("bs1-") for s in ONLY_SUITES):
        parser.error(f"unknown suites in {args.suites!r}")
    variants = set(args.variants.split(","))
    if variants - set(VARIANTS):
        parser.error(f"unknown variants: {sorted(variants - set(VARIANTS))}")
    args.out.mkdir(parents=True, exist_ok=True)
    records: list = []
    saturation: list = []
    env = gpu_env.collect()
    for name in args.models.split(","):
        print(f"== {name}", flush=True)
        bench_model(name, args.root, args.quick, records, saturation, args.compile_suites.split(","), variants,
                    args.profiles)
        result = {"env": env, "records": records, "saturation": saturation}  # written after each model
        (args.out / f"rose_gpu{args.tag}.json").write_text(json.dumps(result, indent=1))
    if saturation:
        plot_saturation(saturation, args.out / f"saturation{args.tag}.png")
    print(f"\n{'model':11s} {'suite':13s} {'variant':20s} {'p50 ms':>9s} {'p99 ms':>9s} {'k tok/s':>9s}")
    for r in records:
        print(f"{r['model']:11s} {r['suite']:13s} {r['variant']:20s} {r['p50_ms']:9.3f} {r['p99_ms']:9.3f} "
              f"{r['tokens_per_s']/1e3:9.1f}")


if __name__ == "__main__":
    main()
