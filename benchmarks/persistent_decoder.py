"""The persistent decoder (rose.layers.persistent_decoder) beside ROSE's layer-by-layer kernels: GPU time per
CUDA-graph replay of the decoder of Qwen3-0.6B, or the encoder of all-MiniLM-L6-v2 (random bf16 weights of the
real shape) at small batches.

    python -m benchmarks.persistent_decoder [--model qwen3-0.6b|minilm-l6] [--tokens 16,32,64,128] [--replays 200]
                                            [--out DIR]

Variants, each captured in a CUDA graph and replayed on the same batch, rounds interleaved:
  layers      the model's forward as served today (cuBLAS GEMMs, ROSE's Triton attention; Qwen3's fused norms)
  persistent  every layer in one persistent kernel (grid barriers between phases)
  launches    the same phases, one launch each (no barriers): what the barriers cost against launches
  +embeddings (BERT) the persistent kernel from the token ids: the embeddings in its first step
then a sweep of the persistent kernel's tiles at the largest token count. Reported: median and p90 of the
replays' GPU time (CUDA events), relative error of the final hidden states against `layers`, and the weight
-read floor at the card's measured copy bandwidth. Writes DIR/persistent_decoder[_MODEL].json; prints a table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
from pathlib import Path

import torch

from benchmarks.attention_ab import replay_times
from benchmarks.gpu_env import copy_bandwidth
from benchmarks.model_zoo import QWEN3_CONFIGS
from rose import Batch
from rose.attention import make_backend
from rose.attention.shape import AttentionShape
from rose.layers.persistent_decoder import (
    FENCES,
    PHASE_NAMES,
    POST_PHASE_NAMES,
    SPIN_LIMIT,
    PersistentDecoder,
    flags_words,
)
from rose.layers.persistent_tiles import WORDS, Tiles
from rose.meta import ForwardMeta, MetaLayout, pack_batch
from rose.models.qwen3 import Qwen3Model

SWEEP = [  # (tokens, changes to the fitted tiles): stages, queries per attention item, slices of K, keys, prefetch,
    # attention computing its own heads (heads False: 32 and 64 keys a step), the heads step's rows, the barrier's form
    (16, {"stages": 4}), (64, {"stages": 4}), (64, {"queries": 16}), (128, {"stages": 4}), (128, {"queries": 16}),
    (128, {"queries": 64}), (128, {"qkv": 32, "split_qkv": 1}), (128, {"keys": 64}), (128, {"keys": 32}),
    (16, {"prefetch": "own"}), (64, {"prefetch": "own"}), (128, {"prefetch": "own"}),
    (16, {"prefetch": "idle", "stages": 4}), (64, {"prefetch": "idle"}),  # (the blocks' own tiles, as counter's)
    (16, {"prefetch": "off", "stages": 4}), (64, {"prefetch": "off"}),  # (16-64 tokens ask "first" by default)
    (128, {"prefetch": "first", "queries": 16, "stages": 4}),
    (16, {"heads": False, "keys": 32}), (64, {"heads": False, "keys": 32}), (128, {"heads": False, "keys": 32}),
    (16, {"heads": True, "stages": 4, "prefetch": "first"}),  # (16 tokens' own tiles but the heads step: 2cf0444's)
    (128, {"heads": False, "keys": 64}), (128, {"head_rows": 32}),
    (16, {"barrier": "fence"}), (64, {"barrier": "fence"}), (128, {"barrier": "fence"}),
    (16, {"stall_every": 1, "prefetch": "first", "stages": 4, "heads": False}),
    (64, {"stall_every": 1, "prefetch": "first"}),
    (128, {"stall_every": 1, "queries": 16, "stages": 4}),  # (the stall word read each poll: 64th by default)
    # the GEMM phases (NOTES "What a step of the persistent kernel costs"): wider column tiles with more slices of K
    # (fewer bytes an SM), and more bytes in flight an SM (a longer K step, deeper pipelines)
    (16, {"o": 64, "down": 64, "split_od": 8}), (64, {"o": 64, "down": 64, "split_od": 8}),
    (128, {"o": 64, "down": 64, "split_od": 8}), (16, {"qkv": 128, "split_qkv": 4}),
    (64, {"qkv": 128, "split_qkv": 4}), (128, {"qkv": 128, "split_qkv": 4}),
    (16, {"k": 256}), (64, {"k": 256}), (16, {"k": 256, "stages": 4}), (16, {"stages": 5}), (64, {"stages": 5}),
    (32, {"prefetch": "off"}), (32, {"prefetch": "first", "stages": 4}),  # 32 tokens: "first" by default (e30f6f9)
    (32, {"heads": False}), (32, {"prefetch": "first", "heads": False}),
    (128, {"queries": 32}), (16, {"stages": 3})]  # the fitted tiles where BLOCK_CHANGES changes them by default


try:
    import triton
    import triton.language as tl

    from rose.layers.grid_sync import grid_barrier

    @triton.jit
    def _barriers_kernel(flags_ptr, n, NPROG_P2: tl.constexpr, SPINS: tl.constexpr, FENCE: tl.constexpr,
                         STALL_EVERY: tl.constexpr):
        for i in range(n):
            grid_barrier(flags_ptr, tl.program_id(0), tl.num_programs(0), i + 1, NPROG_P2, FENCE, SPINS, STALL_EVERY)
except ImportError:  # pragma: no cover - a CPU build of torch without Triton
    triton = None


def random_bert(layers: int | None = None, seed: int = 0, device: str = "cuda", **widths):
    """A BertModel of all-MiniLM-L6-v2's config (`layers` of them; `widths` over its hidden_size,
    num_attention_heads, intermediate_size: bert-large's 1024, 16, 4096, say) with random bf16 weights on `device`."""
    from benchmarks.model_zoo import MINILM_SKELETON
    from rose.models.bert import BertModel

    cfg = json.loads((MINILM_SKELETON / "config.json").read_text())
    cfg.update({"num_hidden_layers": layers} if layers else {}, **widths)
    with torch.device("meta"):
        model = BertModel(cfg)
    return _randomized(model.to_empty(device=device).to(torch.bfloat16), seed, "LayerNorm.weight", 0.05)


def embed(model, meta: ForwardMeta) -> torch.Tensor:
    """What the model's forward hands its layers: Qwen3's token embeddings, BERT's normed embeddings."""
    if hasattr(model, "embed_tokens"):
        return model.embed_tokens(meta.input_ids)
    return model.embeddings(meta.input_ids, meta.positions + model.position_offset)


def setup(name: str):
    """(model, its layers' attention backend, vocabulary size) of qwen3-0.6b or minilm-l6, random bf16."""
    if name == "minilm-l6":
        model = random_bert()
        first = model.encoder.layer[0]
        shape = AttentionShape(first.num_heads, first.num_heads, first.head_dim, causal=False)
        vocab = model.embeddings.word_embeddings.num_embeddings
    else:
        model = random_qwen3(name)
        cfg = QWEN3_CONFIGS[name]
        shape = AttentionShape(cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], causal=True)
        vocab = cfg["vocab_size"]
    return model, make_backend("triton", torch.device("cuda"), torch.bfloat16, shape=shape), vocab


def random_qwen3(name: str = "qwen3-0.6b", causal: bool = True, layers: int | None = None, seed: int = 0,
                 device: str = "cuda") -> Qwen3Model:
    """Qwen3 of the zoo config `name` (`layers` of them) with random bf16 weights on `device`."""
    cfg = dict(QWEN3_CONFIGS[name], **({"num_hidden_layers": layers} if layers else {}))
    with torch.device("meta"):
        model = Qwen3Model(cfg, causal=causal)
    inv_freq = model.rotary.inv_freq.clone()  # built on the CPU, not in the checkpoint
    model = model.to_empty(device=device).to(torch.bfloat16)
    model.rotary.inv_freq = inv_freq.to(device)
    return _randomized(model, seed, "norm", 0.02)


def _randomized(model, seed: int, norm: str, std: float):
    """Every parameter random on its device: the norms' weights around 1 (std 0.1; those whose name holds
    `norm`), the rest around 0 with `std`."""
    device = next(model.parameters()).device
    gen = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32)
            p.copy_(1.0 + 0.1 * noise if norm in name else std * noise)
    return model.eval().requires_grad_(False)


def device_meta(lens: list[int], vocab: int, seed: int = 0, layout: MetaLayout | None = None) -> ForwardMeta:
    """A batch of random ids of these lengths, packed (at `layout`: padded as a graph's batch is) on the GPU."""
    gen = torch.Generator().manual_seed(seed)
    batch = Batch.from_sequences([torch.randint(1, vocab, (n,), generator=gen).tolist() for n in lens])
    host = pack_batch(batch, layout)
    return ForwardMeta.from_buffer(torch.from_numpy(host.packed).cuda(), host.layout, host.layout.tokens, graph=True)


def capture(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def barrier_cost_us(programs: int, count: int = 1000, fence: int = FENCES["acquire"], stall_every: int = 1) -> float:
    """GPU time of one grid barrier of the persistent decoder's, alone: a kernel of `count` of them (fence: its
    form's FENCE, rose.layers.persistent_decoder.FENCES; the counter form reading the stall word every
    `stall_every`-th poll; rose.layers.grid_sync)."""
    words = flags_words(programs)
    flags = torch.zeros(words, dtype=torch.int32, device="cuda")
    p2 = words - 1  # the slots and the stall word (the counter's word after them)

    def run(n):
        flags.zero_()
        _barriers_kernel[(programs,)](flags, n, NPROG_P2=p2, SPINS=SPIN_LIMIT, FENCE=fence, STALL_EVERY=stall_every,
                                      num_warps=8)

    run(10)
    graph, _ = capture(lambda: run(count))
    base, _ = capture(lambda: run(1))
    return (statistics.median(replay_times(graph, 20)) - statistics.median(replay_times(base, 20))) / (count - 1) * 1e3


def phase_us(model, decoder, tokens: int, vocab: int, runs: int = 20) -> dict[str, float]:
    """µs per phase, the mean over the layers of the median over `runs`, from the kernel's own clock (program 0
    reads %globaltimer after each barrier)."""
    meta = device_meta([tokens], vocab, seed=tokens)
    clock = torch.zeros(decoder.steps(tokens) + 1, dtype=torch.int64, device="cuda")
    samples = []
    for _ in range(runs + 3):
        decoder(embed(model, meta), meta.positions, meta.seq_ids, clock=clock)
        torch.cuda.synchronize()
        samples.append(clock.diff().cpu())
    steps = torch.stack(samples[3:]).median(0).values.double() / 1e3
    kinds = decoder.kinds(tokens)
    per_phase = steps[:-1].view(decoder.layers, len(kinds)).mean(0).tolist()
    names = [(POST_PHASE_NAMES if decoder.w.post else PHASE_NAMES)[kind] for kind in kinds]
    return {**dict(zip(names, per_phase)), "final norm": float(steps[-1]), "total": float(steps.sum())}


def forwards(model, decoder, backend, meta) -> dict:
    """The variants' forwards on one batch."""
    variants = {"layers": lambda: model(meta, backend),
                "persistent": lambda: decoder(embed(model, meta), meta.positions, meta.seq_ids),
                "launches": lambda: decoder(embed(model, meta), meta.positions, meta.seq_ids, persistent=False)}
    if decoder.w.post:  # BERT: its embeddings in the kernel's first step too
        variants["+embeddings"] = lambda: decoder.from_ids(meta.input_ids, meta.positions + model.position_offset,
                                                           meta.seq_ids)
    return variants


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="16,32,64,128")
    parser.add_argument("--model", default="qwen3-0.6b", choices=["qwen3-0.6b", "minilm-l6"])
    parser.add_argument("--no-sweep", action="store_true", help="skip the sweep of the tiles")
    parser.add_argument("--sweep", default="", help="only the sweep's rows that change one of these tile fields "
                        "(comma-separated, e.g. prefetch,keys), or that set one to a value (prefetch=first); all "
                        "rows when omitted")
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    parser.add_argument("--phases", action="store_true",
                        help="only the persistent kernel's own clock per phase, at each of --tokens")
    parser.add_argument("--tiles", default="", help="changes to the fitted tiles for every run of this command, "
                        "e.g. o=64,down=64,split_od=8 (the sweep then starts from them)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    model, backend, vocab = setup(args.model)
    decoder = PersistentDecoder(model)
    change_tiles(decoder, args.tiles)
    if args.phases:
        print_phases({t: phase_us(model, decoder, int(t), vocab) for t in args.tokens.split(",")},
                     args.out / f"{stem(args.model)}_phases.json")
        return
    w = decoder.w
    weight_bytes = sum(t.numel() * t.element_size() for t in (w.wqkv, w.wo, w.wgu, w.wd))
    bandwidth = copy_bandwidth()
    floor_ms = weight_bytes / bandwidth * 1e3  # read at the copy's rate of bytes moved
    barrier_us = barrier_cost_us(decoder.programs)  # before the sweep, which a timeout may cut short
    fence_us = barrier_cost_us(decoder.programs, fence=FENCES["fence"])
    counter_us = barrier_cost_us(decoder.programs, fence=FENCES["counter"])
    lean_us = barrier_cost_us(decoder.programs, fence=FENCES["counter"], stall_every=64)
    print(json.dumps({"weight_read_floor_ms": floor_ms, "barrier_us": barrier_us, "barrier_fence_us": fence_us,
                      "barrier_counter_us": counter_us, "barrier_counter_stall64_us": lean_us}), flush=True)
    records = []
    with torch.inference_mode():
        for tokens in [int(t) for t in args.tokens.split(",")]:
            meta = device_meta([tokens], vocab, seed=tokens)
            variants = {name: capture(fn) for name, fn in forwards(model, decoder, backend, meta).items()}
            times = {name: [] for name in variants}
            for _ in range(3):  # rounds, interleaved
                for name, (graph, _) in variants.items():
                    times[name] += replay_times(graph, args.replays)
            ref = variants["layers"][1]
            for name, (graph, out) in variants.items():
                graph.replay()
                torch.cuda.synchronize()
                records.append({"tokens": tokens, "variant": name, "tiles": str(decoder.tiles_at(tokens)),
                                "p50_ms": statistics.median(times[name]),
                                "p90_ms": sorted(times[name])[int(0.9 * len(times[name]))],
                                "rel_err_vs_layers": rel_err(out, ref)})
                print(json.dumps(records[-1]), flush=True)
        layers_out = {}
        fitted = decoder.tiles
        sweep = sweep_rows(args.sweep)
        for tokens, changes in [] if args.no_sweep else sweep:
            tiles = dataclasses.replace(fitted, **changes)
            meta = device_meta([tokens], vocab, seed=tokens)
            if tokens not in layers_out:
                layers_out[tokens] = model(meta, backend).clone()
            try:
                decoder.tiles = tiles
                graph, out = capture(forwards(model, decoder, backend, meta)["persistent"])
                times = replay_times(graph, 3 * args.replays)
            except Exception as exc:  # noqa: BLE001 - a configuration that does not compile is reported
                records.append({"tokens": tokens, "variant": "persistent", "tiles": str(tiles),
                                "error": repr(exc)[:300]})
                continue
            graph.replay()
            torch.cuda.synchronize()
            records.append({"tokens": tokens, "variant": "persistent", "tiles": str(tiles),
                            "p50_ms": statistics.median(times), "p90_ms": sorted(times)[int(0.9 * len(times))],
                            "rel_err_vs_layers": rel_err(out, layers_out[tokens])})
            print(json.dumps(records[-1]), flush=True)
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("GIT_COMMIT", "?"),
           "model": args.model, "programs": decoder.programs, "weight_bytes": weight_bytes,
           "copy_bandwidth_gbs": bandwidth / 1e9, "weight_read_floor_ms": floor_ms, "barrier_us": barrier_us,
           "barrier_fence_us": fence_us, "barrier_counter_us": counter_us, "barrier_counter_stall64_us": lean_us}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem(args.model)}.json").write_text(json.dumps({"env": env, "records": records}, indent=1))
    print(f"\n{env['gpu']} · torch {env['torch']} · {env['commit']} · weight-read floor {floor_ms:.3f} ms "
          f"({bandwidth / 1e9:.0f} GB/s moved by a copy) · one grid barrier: its acquire form {barrier_us:.2f} µs, "
          f"its fence form {fence_us:.2f}, its counter form {counter_us:.2f} ({lean_us:.2f} reading the stall word "
          f"every 64th poll)")
    print(f"{'tokens':>6} {'variant':<11} {'p50 ms':>8} {'p90 ms':>8} {'rel err':>9}  tiles")
    for r in records:
        if "error" in r:
            print(f"{r['tokens']:>6} {r['variant']:<11} {'error':>8}  {r['tiles']}: {r['error'][:80]}")
            continue
        err = f"{r['rel_err_vs_layers']:.2e}" if "rel_err_vs_layers" in r else ""
        print(f"{r['tokens']:>6} {r['variant']:<11} {r['p50_ms']:8.3f} {r['p90_ms']:8.3f} {err:>9}  {r['tiles']}")


def sweep_rows(text: str) -> list[tuple[int, dict]]:
    """--sweep's rows of SWEEP: those that change one of the named fields, or set a `field=value` one to that value
    (the value as --tiles writes it); every row when `text` is empty."""
    chosen = list(filter(None, text.split(",")))

    def hit(changes: dict) -> bool:
        for item in chosen:
            name, eq, value = item.partition("=")
            if name in changes and (not eq or str(changes[name]).lower() == value.lower()):
                return True
        return False

    return [(t, c) for t, c in SWEEP if not chosen or hit(c)]


FLAGS = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False}


def change_tiles(decoder: PersistentDecoder, text: str) -> None:
    """--tiles' changes (tile_changes) to the decoder's fitted tiles, at every token block (setting tiles sets them
    for every block: none of BLOCK_CHANGES then); nothing when `text` is empty."""
    if text:
        decoder.tiles = dataclasses.replace(decoder.tiles, **tile_changes(text))


def tile_changes(text: str) -> dict:
    """`field=value,...` as changes to Tiles (ints, true/false, on/off, 1/0 for its flags, one of its words for the
    barrier's form and the prefetch: persistent_tiles.WORDS); anything else, or a field Tiles lacks, is refused
    naming the item."""
    fields = {f.name: f.type for f in dataclasses.fields(Tiles)}
    changes = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        flag, words = fields.get(name) in (bool, "bool"), WORDS.get(name)
        word = value.lower()
        ok = name in fields and (word in FLAGS if flag else word in words if words else value.isdigit())
        if not ok:
            raise SystemExit(f"--tiles: {item!r} is not field=value for one of {', '.join(fields)} "
                             f"(an int, true/false for a flag, one of its words: {WORDS})")
        changes[name] = FLAGS[word] if flag else word if words else int(value)
    return changes


def stem(model: str) -> str:
    """Results' file name: persistent_decoder for the 0.6B, persistent_decoder_<model> for another."""
    return "persistent_decoder" + ("" if model == "qwen3-0.6b" else f"_{model}")


def print_phases(table: dict[str, dict[str, float]], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("GIT_COMMIT", "?")}
    out.write_text(json.dumps({"env": env, "phases_us": table}, indent=1))
    print(f"\n{env['gpu']} · {env['commit']} · µs per phase (mean over layers), the kernel's own clock")
    names = list(next(iter(table.values())))
    print(f"{'tokens':>6} " + " ".join(f"{n:>11}" for n in names))
    for tokens, row in table.items():
        print(f"{tokens:>6} " + " ".join(f"{row[n]:11.2f}" for n in names))


if __name__ == "__main__":
    main()
