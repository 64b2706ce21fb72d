"""`rose`: inspect and try a model folder with the engine in-process.

    rose info MODEL_DIR                 the EngineInfo as JSON
    rose embed MODEL_DIR "text" ...     embeddings as JSON (default options of the model)
    rose smoke MODEL_DIR [KEYS]         graph replay vs eager on this GPU; exit 1 on failure (deploy gate)
    rose build-kernels MODEL_DIR [--backends B,..] [--cache-dir DIR]   compile JIT and Triton kernels ahead

Engine options are flags of `info` and `embed` and ROSE_* environment variables (rose.flags); `smoke` and
`build-kernels` read the variables only. `embed`'s own --dimensions, --normalize and --prompt-name have no variable.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rose.flags import add_config_arguments, config_from_args
from rose.persistent_routing import DEFAULT_ROUTING, routed_tokens
from rose.buckets import DEFAULT_SEQ_BUCKETS, DEFAULT_TOKEN_BUCKETS, parse_layouts

PREFIX = "ROSE"


@dataclass(frozen=True)
class EngineConfig:
    device: str | None = field(default=None, metadata={"help": "cpu, cuda or cuda:N; empty = CUDA when available"})
    dtype: str | None = field(default=None, metadata={"help": "float32, bfloat16 or float16; empty = float32 on CPU, bfloat16 on CUDA"})
    attention: str = field(default="auto", metadata={"help": "attention backend: auto (the serving profile beside the model, else triton on CUDA where it runs the model's attention, else varlen; sdpa on CPU), sdpa, varlen, triton, flashinfer-fa2, flashinfer-fa3 or fa4"})
    pinned_cap_bytes: int = field(default=256 << 20, metadata={"help": "cap on page-locked output buffers, bytes"})
    pinned_timeout_s: float = field(default=30.0, metadata={"help": "seconds a step waits at the pinned cap before failing"})
    model_id: str | None = field(default=None, metadata={"help": "model name to report; empty = the folder's"})
    cuda_graphs: bool | None = field(default=None, metadata={"help": "whole-model CUDA graphs; empty = on when on CUDA"})
    token_buckets: tuple[int, ...] = field(default=DEFAULT_TOKEN_BUCKETS, metadata={"help": "padded token-count bucket edges of the CUDA graphs (comma list)"})
    seq_buckets: tuple[int, ...] = field(default=DEFAULT_SEQ_BUCKETS, metadata={"help": "sequence-count bucket edges of the CUDA graphs (comma list)"})
    prewarm: str = field(default="128x1,512x1,2048x8,singles:512,mix:48", metadata={"help": "TOKENSxSEQS keys and named sets (singles:N, mix:K; rose/prewarm_sets.py) whose graphs are captured and verified before ready"})
    graph_manifest: str | None = field(default="auto", metadata={"help": "hot-layout manifest file to prewarm from and record to; auto = beside the model; empty = off"})
    kernel_manifest: str | None = field(default="auto", metadata={"help": "Triton kernel manifest to compile ahead from and record to (rose.kernel_ahead); auto = rose_kernels.json beside the model; empty = off"})
    persistent_decoder: str = field(default=DEFAULT_ROUTING, metadata={"help": "Qwen3 models and BERT-style encoders on CUDA: auto (default) = only the layer shapes measured faster (Qwen3-0.6B's up to 128 tokens, all-MiniLM's up to 16), on = batches of up to 128 tokens (Qwen3) or 16 tokens (BERT-style, where it beat their layers), N = up to N tokens (at most 128), run every layer in one persistent kernel (rose/layers/persistent_decoder.py; Qwen3-0.6B 9-15 % faster at 16-128 tokens on the H200); off = the layer-by-layer kernels"})

    def __post_init__(self) -> None:
        routed_tokens(self.persistent_decoder)  # ValueError naming the setting and what it takes


def load_engine(model_dir: str, cfg: EngineConfig):
    from rose.engine import Engine

    kwargs = dataclasses.asdict(cfg)
    kwargs["prewarm"] = parse_layouts(cfg.prewarm)
    return Engine.from_pretrained(model_dir, **kwargs)


def cmd_smoke(args: argparse.Namespace, cfg: EngineConfig) -> int:
    """Deploy gate for a new driver or GPU: capture graphs, replay them, compare with eager; exit 1 on failure."""
    import torch

    from rose.graphs import GraphVerificationError, layout_label

    if not torch.cuda.is_available():
        print("rose smoke: no CUDA device; graph replay cannot be checked here", file=sys.stderr)
        return 1
    keys = args.keys or cfg.prewarm
    cfg = dataclasses.replace(cfg, cuda_graphs=True, prewarm=keys, graph_manifest=None)
    try:
        engine = load_engine(args.model_dir, cfg)
        verified = engine.warmup()
    except GraphVerificationError as exc:
        print(f"rose smoke: FAIL: {exc}", file=sys.stderr)
        return 1
    if not verified:
        print(f"rose smoke: FAIL: none of the keys {keys!r} gave a graph to verify", file=sys.stderr)
        return 1
    print(f"{'graph':22s} {'divergence':>12s} {'capture s':>10s}")
    for v in verified:
        print(f"{layout_label(v.layout):22s} {v.max_divergence:12.2e} {v.capture_s:10.3f}")
    print(f"rose smoke: OK, {len(verified)} graphs replayed and matched eager on {torch.cuda.get_device_name()} "
          f"(torch {torch.__version__}, CUDA {torch.version.cuda})")
    engine.close()
    return 0


def cmd_info(args: argparse.Namespace, cfg: EngineConfig) -> int:
    engine = load_engine(args.model_dir, cfg)
    print(json.dumps(dataclasses.asdict(engine.info), indent=2))
    engine.close()
    return 0


def cmd_embed(args: argparse.Namespace, cfg: EngineConfig) -> int:
    from rose.head import OutputOptions

    engine = load_engine(args.model_dir, cfg)
    texts = list(args.texts) or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        print("rose embed: no texts given", file=sys.stderr)
        return 2
    if args.prompt_name:
        if args.prompt_name not in engine.spec.prompts:
            print(f"rose embed: unknown prompt {args.prompt_name!r}; the model has {sorted(engine.spec.prompts)}",
                  file=sys.stderr)
            return 2
        texts = [engine.spec.prompts[args.prompt_name] + t for t in texts]
    elif engine.spec.default_prompt_name in engine.spec.prompts:  # as sentence-transformers' encode() without one
        texts = [engine.spec.prompts[engine.spec.default_prompt_name] + t for t in texts]
    encoded = engine.tokenizer.encode_batch(texts)
    normalize = None if args.normalize is None else args.normalize == "true"
    vectors = engine.embed([e.ids for e in encoded], options=OutputOptions(dimensions=args.dimensions, normalize=normalize))
    for text, enc, vec in zip(texts, encoded, vectors):
        print(json.dumps({"text": text, "tokens": len(enc.ids), "embedding": [round(float(x), 6) for x in vec]}))
    engine.close()
    return 0


def cmd_build_kernels(args: argparse.Namespace, cfg: EngineConfig) -> int:
    """Compile kernels ahead of serving into --cache-dir, so a replica started with ROSE_KERNEL_CACHE_DIR=DIR
    loads them instead of compiling at start. On a GPU: the JIT attention backends (FlashInfer / FA4) for this
    model's shape, and a warm-up of the engine, which compiles ROSE's Triton kernels and records their variants
    in the kernel manifest (rose_kernels.json beside the model, rose.kernel_manifest). Without a GPU (an image
    build): the manifest's Triton variants, for the GPUs they were recorded on."""
    from rose.kernel_cache import use_kernel_cache

    cache = use_kernel_cache(args.cache_dir)  # before flashinfer / flash_attn are imported
    import torch

    from rose.attention import AttentionShape, ServingProfile, profile_path
    from rose.attention.kernels import JIT_BACKENDS, build_kernels
    from rose.devices import resolve_dtype
    from rose.spec import load_spec

    named = args.backends not in (None, "", "profile")
    if not torch.cuda.is_available():
        if named:
            print("rose build-kernels: no CUDA device; the JIT attention kernels compile for the GPU they run on",
                  file=sys.stderr)
            return 1
        return _build_triton_from_manifest(Path(args.model_dir), cfg.kernel_manifest or "auto", cache)
    spec = load_spec(args.model_dir)
    backends = args.backends.split(",") if named else list(JIT_BACKENDS)
    if not named and profile_path(spec.model_dir).is_file():
        named = True
        backends = sorted(set(ServingProfile.load(profile_path(spec.model_dir)).attention.values()) & set(JIT_BACKENDS))
    device = torch.device("cuda", torch.cuda.current_device())
    records = build_kernels(AttentionShape.from_spec(spec), backends, device, resolve_dtype(cfg.dtype, device))
    records.append(_build_triton_by_warmup(args.model_dir, cfg))
    print(f"{'backend':16s} {'status':12s} {'first use s':>11s}  cache {cache or '(library default)'}")
    for r in records:
        detail = r.get("error") or r.get("note", "")
        print(f"{r['backend']:16s} {r['status']:12s} {r['seconds']:11.2f}  {detail}")
    bad = [r for r in records if r["status"] == "failed" or (named and r["status"] == "unavailable")]
    return 1 if bad else 0


def _build_triton_by_warmup(model_dir: str, cfg: EngineConfig) -> dict:
    """ROSE's Triton kernels: the engine warmed up as a replica's start warms it, its variants recorded."""
    start = time.perf_counter()
    record = {"backend": "triton (ROSE)", "status": "built"}
    try:
        engine = load_engine(model_dir, dataclasses.replace(cfg, graph_manifest=None))
        try:
            engine.warmup()
            record["note"] = f"{engine.save_kernel_manifest()} variants in {engine.kernel_manifest}"
        finally:
            engine.close()
    except Exception as exc:  # noqa: BLE001 - reported in the table, the exit status 1
        record.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:400])
    record["seconds"] = round(time.perf_counter() - start, 2)
    return record


def _build_triton_from_manifest(model_dir: Path, manifest: str, cache) -> int:
    """No GPU: compile the kernel manifest's Triton variants for the GPUs they were recorded on into the cache."""
    try:
        from rose import kernel_ahead
        from rose.kernel_manifest import manifest_paths, read_entries
    except ImportError as exc:
        print(f"rose build-kernels: {exc}: ROSE's Triton kernels need Triton", file=sys.stderr)
        return 1
    reads, _ = manifest_paths(model_dir, manifest)
    entries = read_entries(reads)
    if not entries:
        print(f"rose build-kernels: no CUDA device and no kernel manifest beside {model_dir}: run build-kernels "
              "on a GPU once (it records one there), or on the serving machine itself", file=sys.stderr)
        return 1
    by_target: dict[str, list[dict]] = {}
    for entry in entries:
        by_target.setdefault(json.dumps(entry["target"], sort_keys=True), []).append(entry)
    start, failed = time.perf_counter(), 0
    for target, mine in by_target.items():
        workers = kernel_ahead.start_workers(mine, mine[0]["target"])
        report = workers.wait(timeout=3600) if workers else kernel_ahead.compile_entries(mine[0]["target"], mine)
        failed += report["failed"]
        print(f"rose build-kernels: {report['compiled']} of {len(mine)} Triton variants for {target} in the cache "
              f"({report['stale']} stale, {report['failed']} failed), {time.perf_counter() - start:.1f} s, "
              f"cache {cache or '(default)'}")
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rose", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="print the engine info of a model folder")
    info.add_argument("model_dir")
    info.set_defaults(func=cmd_info)
    smoke = sub.add_parser("smoke", help="graph-replay smoke test for a new driver or GPU (exit 1 on failure)")
    smoke.add_argument("model_dir")
    smoke.add_argument("keys", nargs="?", default=None, help="TOKENSxSEQS keys and named sets, comma separated "
                       f"(default: $ROSE_PREWARM, else {EngineConfig.prewarm}; smoke takes no --prewarm flag)")
    smoke.set_defaults(func=cmd_smoke)
    embed = sub.add_parser("embed", help="embed texts (arguments, or stdin lines) and print JSON lines")
    embed.add_argument("model_dir")
    embed.add_argument("texts", nargs="*")
    embed.add_argument("--dimensions", type=int, default=0, help="Matryoshka truncation; 0 = full width")
    embed.add_argument("--normalize", choices=("true", "false"), default=None, help="default: the model's")
    embed.add_argument("--prompt-name", default=None,
                       help="prepend this sentence-transformers prompt (default: the model's default_prompt_name)")
    embed.set_defaults(func=cmd_embed)
    build = sub.add_parser("build-kernels", help="compile the JIT attention kernels (FlashInfer, FA4) and ROSE's "
                           "Triton kernels ahead of serving")
    build.add_argument("model_dir")
    build.add_argument("--backends", default="profile",
                       help="comma list of flashinfer-fa2, flashinfer-fa3, fa4; profile (default) = those the "
                            "serving profile names, or all that can run here when there is none")
    build.add_argument("--cache-dir", default=None, help="kernel cache directory [env ROSE_KERNEL_CACHE_DIR]")
    build.set_defaults(func=cmd_build_kernels)
    for p in (info, embed):
        add_config_arguments(p, EngineConfig, PREFIX)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(EngineConfig, args, PREFIX)
    try:
        return args.func(args, cfg)
    except (ValueError, RuntimeError) as exc:  # ModelFolderError, BatchError, backend errors: one line
        print(f"rose {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
