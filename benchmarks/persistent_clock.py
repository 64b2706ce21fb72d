"""Every program's clock in the persistent decoder (issue 14; NOTES "What a step of the persistent kernel costs"):
each program writes when its work in each step starts and ends (rose.layers.persistent_decoder, a clock of
[steps, programs, 4]: %globaltimer in ns, comparable between SMs, and its SM's %clock64 cycles, finer within a
program), so a step's time splits into

  skew      the last program's start after the first's (how unevenly the barrier releases them)
  work      one program's work from its start to its end (cycles as ns): the median program, the slowest, the least
  span      the first start to the last end (work max + how late the slowest program started)
  release   the last program's end to the next step's first start: the barrier from its last arrival
  step      the first start to the next step's first start (span + release)

per kind of phase (the mean over the layers of the median over runs), at each token count.

    python -m benchmarks.persistent_clock [--model qwen3-0.6b|minilm-l6] [--tokens 16,64,128] [--runs 21]
                                          [--tiles o=64,...] [--out DIR]

Writes DIR/persistent_clock[_MODEL].json; prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

STATS = ("skew", "work p50", "work max", "work min", "span", "release", "step")


def split_steps(clock: torch.Tensor) -> dict[str, torch.Tensor]:
    """clock: int64 [runs, steps, programs, 4] (start ns, end ns, start cycle, end cycle) -> each of STATS in µs
    per step, the median over runs (the lower of the two middle ones for an even count). Cycles are read as ns at
    each program's own rate over the whole forward (its cycles over its ns from its first start to its last end).
    Step 0's skew is the launch's (no barrier before it). The last step has no next start: its release is 0 and
    its step is its span."""
    c = clock.double()
    start, end = c[..., 0], c[..., 1]
    cycles = c[..., 3] - c[..., 2]
    work = cycles / _rates(c)[:, None, :]
    first = start.min(-1).values
    last_end = end.max(-1).values
    release = torch.zeros_like(first)
    release[:, :-1] = first[:, 1:] - last_end[:, :-1]
    stats = {"skew": start.max(-1).values - first, "work p50": work.median(-1).values,
             "work max": work.max(-1).values, "work min": work.min(-1).values, "span": last_end - first,
             "release": release}
    stats["step"] = stats["span"] + release
    return {name: value.median(0).values / 1e3 for name, value in stats.items()}


def sm_ghz(clock: torch.Tensor) -> float:
    """The SMs' clock over a forward: the median over runs and programs of each program's cycles a ns (split_steps'
    rate), so that an A/B between processes can tell a slower kernel from a slower clock."""
    return float(_rates(clock.double()).median())


def _rates(c: torch.Tensor) -> torch.Tensor:
    """[runs, programs] cycles a ns: each program's cycles over its ns from its first start to its last end."""
    return (c[:, -1, :, 3] - c[:, 0, :, 2]) / (c[:, -1, :, 1] - c[:, 0, :, 0])


def per_kind(steps: dict[str, torch.Tensor], layers: int, names: list[str]) -> dict[str, dict[str, float]]:
    """split_steps' per-step stats -> {phase name: {stat: mean over the layers}}; the final norm, then the
    forward's total of each stat (the sum of the steps' medians), last."""
    phases = len(names)
    table = {name: {} for name in [*names, "final norm", "total"]}
    for stat, values in steps.items():
        means = values[:-1].view(layers, phases).mean(0).tolist()
        for name, mean in zip(names, means):
            table[name][stat] = mean
        table["final norm"][stat] = float(values[-1])
        table["total"][stat] = float(values.sum())
    return table


def measure(model, decoder, tokens: int, vocab: int, runs: int) -> tuple[dict[str, dict[str, float]], float]:
    """{phase: {stat: µs}} at `tokens` (per_kind), and the SMs' GHz over those runs (sm_ghz)."""
    from benchmarks.persistent_decoder import device_meta, embed
    from rose.layers.persistent_decoder import PHASE_NAMES, POST_PHASE_NAMES

    meta = device_meta([tokens], vocab, seed=tokens)
    clock = torch.zeros(decoder.steps(tokens), decoder.programs, 4, dtype=torch.int64, device="cuda")
    samples = []
    for i in range(runs + 3):
        decoder(embed(model, meta), meta.positions, meta.seq_ids, clock=clock)
        torch.cuda.synchronize()
        if i >= 3:  # warm-up first
            samples.append(clock.cpu())
    names = [(POST_PHASE_NAMES if decoder.w.post else PHASE_NAMES)[kind] for kind in decoder.kinds(tokens)]
    clocks = torch.stack(samples)
    return per_kind(split_steps(clocks), decoder.layers, names), sm_ghz(clocks)


def main() -> None:
    from benchmarks.persistent_decoder import change_tiles, setup, stem
    from rose.layers.persistent_decoder import PersistentDecoder

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen3-0.6b", choices=["qwen3-0.6b", "minilm-l6"])
    parser.add_argument("--tokens", default="16,64,128")
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--tiles", default="", help="changes to the fitted tiles, as benchmarks.persistent_decoder")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    model, _, vocab = setup(args.model)
    decoder = PersistentDecoder(model)
    change_tiles(decoder, args.tiles)
    with torch.inference_mode():
        measured = {t: measure(model, decoder, int(t), vocab, args.runs) for t in args.tokens.split(",")}
    tables = {t: table for t, (table, _) in measured.items()}
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("GIT_COMMIT", "?"),
           "programs": decoder.programs, "runs": args.runs, "tiles": args.tiles,
           "sm_ghz": {t: ghz for t, (_, ghz) in measured.items()}}
    out = args.out / (stem(args.model).replace("persistent_decoder", "persistent_clock") + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"env": env, "us": tables}, indent=1))
    print_tables(env, tables)


def print_tables(env: dict, tables: dict[str, dict[str, dict[str, float]]]) -> None:
    print(f"\n{env['gpu']} · {env['commit']} · {env['programs']} programs · µs a step (mean over layers, median of "
          f"{env['runs']} runs), every program's clock")
    for tokens, table in tables.items():
        ghz = env.get("sm_ghz", {}).get(tokens)
        sms = f"   (SMs at {ghz:.3f} GHz)" if ghz else ""
        print(f"\n{tokens} tokens  " + " ".join(f"{s:>9}" for s in STATS) + sms)
        for name, row in table.items():
            print(f"{name:>14} " + " ".join(f"{row[s]:9.2f}" for s in STATS))


if __name__ == "__main__":
    main()
