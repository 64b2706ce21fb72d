"""A/B of ROSE's attention backends per model and shape: GPU time inside a CUDA graph (issue 7).

    python -m benchmarks.attention_ab [--models qwen3-0.6b,qwen3-4b,minilm-l6] [--model-dir DIR]
        [--backends sdpa,varlen,flashinfer-fa2,flashinfer-fa3,fa4,triton] [--causal] [--quick]
        [--out benchmarks/results] [--profile-dir DIR]

For every shape (1x128 ... 1x16384, 50x512, 100 mixed documents of 16..512 tokens, lognormal, seed 0) and
every backend: random bf16 q/k/v of the model's attention shape, the backend planned on the host as a graph
runner plans it, then `reps` attention calls captured in one CUDA graph (as the layers of a whole-model
graph run back to back) and replayed; per call GPU time = median replay time (CUDA events) / reps. The
layout is the shape's exact size (no bucket padding) with the longest sequence as its max-seqlen bound.
max_abs_err is against a float32 SDPA reference per sequence. Backends that cannot run (package missing, GPU or head dim unsupported) or fail are recorded
with status and error, never crash the run.

Writes OUT/attention_backends.json ({"env", "records": [{"model", "shape", "backend", "us",
"max_abs_err", ...}], "first_use"}) and, per model, the serving profile (winner per engine token bucket,
rose.attention.profile): PROFILE_DIR/<model>/rose_profile.json, or beside the model for --model-dir.
Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
import torch.nn.functional as F

from rose.attention import (
    AttentionBackendError,
    AttentionShape,
    ServingProfile,
    make_backend,
)
from rose.attention.profile import profile_path, winners_per_bucket
from rose.attention.shape import NAMED_MAX_LENGTH, NAMED_SHAPES
from rose.batch import Batch
from rose.buckets import DEFAULT_TOKEN_BUCKETS
from rose.meta import ForwardMeta, MetaLayout, pack_batch

BACKENDS = ("sdpa", "varlen", "flashinfer-fa2", "flashinfer-fa3", "fa4", "triton")
ERR_TOL = 0.05  # a backend further than this from the float32 reference cannot win (bf16 noise is ~1e-2)
# the graph buckets, plus one entry for the eager batches above them (e.g. 50 x 512 tokens)
PROFILE_BUCKETS = tuple(sorted(set(DEFAULT_TOKEN_BUCKETS) | {2 * max(DEFAULT_TOKEN_BUCKETS)}))
TIME_BUDGET_S = 0.4  # replays per case: as many as fit, between 5 and 50


def docs_100(seed: int = 0) -> list[int]:
    from benchmarks.rose_gpu import docs_100 as lengths

    return lengths(512, seed)


def shapes(quick: bool) -> dict[str, list[int]]:
    out = {f"1x{n}": [n] for n in (128, 512, 1024, 2048, 4096, 8192, 16384)}
    out["50x512"] = [512] * 50
    out["100-docs"] = docs_100()
    return {k: v for k, v in out.items() if k in ("1x128", "1x4096", "50x512")} if quick else out


class Case:
    """One shape's inputs on the device: packed metadata, q/k/v, and the float32 reference output."""

    def __init__(self, lengths: list[int], shape: AttentionShape, device: torch.device, seed: int = 0) -> None:
        self.lengths, self.tokens = lengths, sum(lengths)
        # a graph layout (Tb = T, Sb = S) with the longest sequence as its max-seqlen bound, as rose.graphs keys them
        layout = MetaLayout(self.tokens, len(lengths), len(lengths), max(lengths))
        host = pack_batch(Batch.from_sequences([[1] * n for n in lengths]), layout)
        self.meta = ForwardMeta.from_buffer(torch.from_numpy(host.packed).to(device), layout, max(lengths), host,
                                            graph=True)
        gen = torch.Generator(device=device).manual_seed(seed)
        self.q, self.k, self.v = (torch.randn(self.tokens, h, shape.head_dim, device=device, generator=gen,
                                              dtype=torch.bfloat16)
                                  for h in (shape.num_qo_heads, shape.num_kv_heads, shape.num_kv_heads))
        self.ref = reference(self.q, self.k, self.v, lengths, shape)


def reference(q, k, v, lengths: list[int], shape: AttentionShape) -> torch.Tensor:
    """float32 SDPA per sequence (K/V heads repeated: the fused fp32 kernels take no GQA)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out, at = torch.empty(q.shape, dtype=torch.float32, device=q.device), 0
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        for n in lengths:
            qs, ks, vs = (x[at:at + n].float().transpose(0, 1)[None] for x in (q, k, v))
            ks, vs = (x.repeat_interleave(shape.group, dim=1) for x in (ks, vs))
            out[at:at + n] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=shape.causal,
                                                             scale=shape.scale)[0].transpose(0, 1)
            at += n
    return out


def time_in_graph(backend, case: Case, shape: AttentionShape) -> dict:
    """Plan, warm up eagerly on a side stream (JIT, autotuning), capture `reps` calls, replay with events."""
    meta, causal, scale = case.meta, shape.causal, shape.scale
    backend.plan(meta)  # a first plan may build the JIT module: not timed
    state = backend.prepare(meta, causal)  # once per forward in the engine, shared by all layers
    stream = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(stream)
    with torch.cuda.stream(side):
        out = backend.forward(case.q, case.k, case.v, meta, causal, scale, state)
    stream.wait_stream(side)
    torch.cuda.synchronize()
    err = float((out[: case.tokens].float() - case.ref).abs().max())
    reps = 8 if case.tokens <= 2048 else 2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [backend.forward(case.q, case.k, case.v, meta, causal, scale, state) for _ in range(reps)]
    plans = []
    for _ in range(7):  # as before every replay; host time, reported as plan_us (not in the GPU time)
        start = time.perf_counter()
        backend.plan(meta)
        plans.append((time.perf_counter() - start) * 1e6)
    plan_us = statistics.median(plans)
    graph.replay()
    torch.cuda.synchronize()
    err = max(err, float((outs[-1][: case.tokens].float() - case.ref).abs().max()))
    times = replay_times(graph, 3)
    iters = int(min(50, max(5, TIME_BUDGET_S / max(statistics.median(times) / 1e3, 1e-6))))
    times = replay_times(graph, iters)
    del graph, outs
    return {"us": round(statistics.median(times) * 1e3 / reps, 2), "max_abs_err": round(err, 5),
            "plan_us": round(plan_us, 1), "iters": iters, "reps": reps}


def replay_times(graph: torch.cuda.CUDAGraph, iters: int) -> list[float]:
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in events:
        a.record()
        graph.replay()
        b.record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in events]  # ms


def bench_model(model: str, shape: AttentionShape, max_length: int, backends: list[str], quick: bool,
                records: list, first_use: list, device: torch.device | None = None) -> list[dict]:
    device = device or torch.device("cuda", torch.cuda.current_device())
    instances: dict[str, object] = {}
    broken: dict[str, dict] = {}  # backends that cannot run here, or failed before ever succeeding
    ok: set[str] = set()
    rows = []
    for label, lengths in shapes(quick).items():
        if max(lengths) > max_length:
            continue  # the model takes no sequence this long
        case = Case(lengths, shape, device)
        for name in backends:
            rec = {"model": model, "shape": label, "backend": name, "us": None, "max_abs_err": None,
                   "tokens": case.tokens, "seqs": len(lengths), "causal": shape.causal}
            start = time.perf_counter()
            try:
                if name in broken:
                    rec.update(broken[name])
                else:
                    if name not in instances:
                        instances[name] = make_backend(name, device, torch.bfloat16, shape=shape)
                    rec.update(time_in_graph(instances[name], case, shape), status="ok")
                    ok.add(name)
            except AttentionBackendError as exc:
                rec.update(status="unavailable", error=str(exc)[:300])
            except Exception as exc:  # noqa: BLE001 - a kernel that fails here is recorded, the run goes on
                rec.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:300])
            if rec["status"] != "ok" and name not in ok:  # don't retry a JIT build that broke, per shape
                broken.setdefault(name, {"status": rec["status"], "error": rec.get("error")})
            if name not in {f["backend"] for f in first_use if f["model"] == model}:
                first_use.append({"model": model, "backend": name, "status": rec["status"],
                                  "first_use_s": round(time.perf_counter() - start, 2)})
            records.append(rec)
            rows.append(rec)
            print(f"  {model:11s} {label:9s} {name:15s} {rec['status']:11s} "
                  f"{rec['us'] if rec['us'] is not None else '-':>10} us  err {rec['max_abs_err']}", flush=True)
        del case
        torch.cuda.empty_cache()
    return rows


def winners(rows: list[dict]) -> dict[str, dict]:
    """Per shape: the fastest backend whose error is within ERR_TOL, and every backend's time."""
    out: dict[str, dict] = {}
    for r in rows:
        entry = out.setdefault(r["shape"], {"tokens": r["tokens"], "winner": None, "us": {}})
        if r.get("status") != "ok":
            continue
        entry["us"][r["backend"]] = r["us"]
        if r["max_abs_err"] is not None and r["max_abs_err"] <= ERR_TOL:
            best = entry["winner"]
            if best is None or r["us"] < entry["us"][best]:
                entry["winner"] = r["backend"]
    return out


def make_profile(model: str, rows: list[dict], env: dict) -> ServingProfile | None:
    table = winners(rows)
    measured = [(e["tokens"], e["winner"]) for e in table.values() if e["winner"]]
    if not measured:
        return None
    info = {"model": model, "gpu": env.get("gpu"), "dtype": "bfloat16", "causal": rows[0]["causal"],
            "source": "python -m benchmarks.attention_ab", "measured": [{"shape": s, **e} for s, e in table.items()]}
    return ServingProfile(winners_per_bucket(measured, PROFILE_BUCKETS), info)


def print_table(records: list[dict], backends: list[str]) -> None:
    print(f"\n{'model':11s} {'shape':9s} " + " ".join(f"{b:>14s}" for b in backends) + "  winner (us per call)")
    for model in dict.fromkeys(r["model"] for r in records):
        rows = [r for r in records if r["model"] == model]
        for label, entry in winners(rows).items():
            cells = [entry["us"].get(b) for b in backends]
            print(f"{model:11s} {label:9s} " + " ".join(f"{c:14.1f}" if c is not None else f"{'-':>14s}"
                                                         for c in cells) + f"  {entry['winner'] or '-'}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="qwen3-0.6b,qwen3-4b,minilm-l6", help="named attention shapes")
    parser.add_argument("--model-dir", type=Path, default=None, help="measure this model folder instead")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--causal", action="store_true", help="named shapes causal (Qwen3-Embedding)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tag", default="", help="suffix of the results file name (attention_backends<TAG>.json)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--profile-dir", type=Path, default=None,
                        help="write PROFILE_DIR/<model>/rose_profile.json (default OUT/profiles)")
    parser.add_argument("--build-kernels", action="store_true",
                        help="first compile the JIT backends per shape (rose build-kernels) and record the seconds")
    parser.add_argument("--cache-dir", default=None, help="kernel cache directory [env ROSE_KERNEL_CACHE_DIR]")
    parser.add_argument("--print-table", type=Path, default=None, help="only print the table of a results file")
    args = parser.parse_args(argv)
    if args.print_table is not None:
        data = json.loads(args.print_table.read_text())
        print_first_use(data.get("build", []), data.get("first_use", []))
        print_table(data["records"], list(dict.fromkeys(r["backend"] for r in data["records"])))
        return 0
    from rose.kernel_cache import use_kernel_cache

    use_kernel_cache(args.cache_dir)  # before FlashInfer / FA4 are imported
    if not torch.cuda.is_available():
        print("attention_ab: needs a CUDA GPU")
        return 1
    from benchmarks import gpu_env

    env = gpu_env.collect()
    for package in ("flashinfer-python", "flash-attn-4"):
        try:
            env[package] = version(package)
        except PackageNotFoundError:
            env[package] = None
    backends = [b for b in args.backends.split(",") if b]
    if args.model_dir is not None:
        from rose.spec import load_spec

        spec = load_spec(args.model_dir)
        targets = [(spec.model_dir.name, AttentionShape.from_spec(spec), spec.max_length,
                    profile_path(spec.model_dir))]
    else:
        targets = []
        for name in args.models.split(","):
            s = NAMED_SHAPES[name]
            s = AttentionShape(s.num_qo_heads, s.num_kv_heads, s.head_dim, args.causal)
            profile_dir = args.profile_dir or args.out / "profiles"
            folder = name + ("-causal" if args.causal else "")
            targets.append((name, s, NAMED_MAX_LENGTH[name], profile_dir / folder / "rose_profile.json"))
    args.out.mkdir(parents=True, exist_ok=True)
    records: list = []
    first_use: list = []
    build: list = []
    for model, shape, max_length, ppath in targets:
        print(f"== {model} {shape}", flush=True)
        if args.build_kernels:
            from rose.attention.kernels import JIT_BACKENDS, build_kernels

            for r in build_kernels(shape, [b for b in backends if b in JIT_BACKENDS]):
                build.append({"model": model, **r})
                print(f"  build {r['backend']:15s} {r['status']:11s} {r['seconds']:8.2f} s {r.get('error', '')}", flush=True)
        rows = bench_model(model, shape, max_length, backends, args.quick, records, first_use)
        (args.out / f"attention_backends{args.tag}.json").write_text(
            json.dumps({"env": env, "records": records, "first_use": first_use, "build": build}, indent=1))
        profile = make_profile(model, rows, env)
        if profile is not None:
            ppath.parent.mkdir(parents=True, exist_ok=True)
            print(f"  serving profile -> {profile.save(ppath)}", flush=True)
    print_first_use(build, first_use)
    print_table(records, backends)
    return 0


def print_first_use(build: list[dict], first_use: list[dict]) -> None:
    """Seconds of a backend's first use: the build step's (cold JIT) and the A/B's (cache load once built)."""
    print(f"\n{'model':11s} {'backend':15s} {'build status':12s} {'build s':>8s} {'A/B first use s':>16s}")
    for f in first_use:
        b = next((x for x in build if x["model"] == f["model"] and x["backend"] == f["backend"]), None)
        print(f"{f['model']:11s} {f['backend']:15s} {b['status'] if b else '-':12s} "
              f"{b['seconds'] if b else float('nan'):8.2f} {f['first_use_s']:16.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
