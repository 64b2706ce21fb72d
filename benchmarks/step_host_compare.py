"""`python -m benchmarks.step_host_compare DIR [DIR ...]`: the rounds of `device.sh step-host`'s A/B side by side, from
its files (`step_host_<model>_{base,head}<round>.json`, any number of calls' folders): per model and batch shape, the
median over the rounds of each side's p50s for the work before the replay (layout + pack + buffer + stage + dispatch),
its parts, step() and host to host, and the replay's GPU time, then each round's host to host. Host-only: runs on
any machine. What NOTES' "ROSE's host time per step" tables are made from."""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

BEFORE_REPLAY = ("layout", "pack", "buffer", "stage", "dispatch")
COLUMNS = ("before replay", "layout", "pack", "stage", "step", "host_to_host", "gpu")
NAME = re.compile(r"step_host_(?P<model>.+)_(?P<side>base|head)(?P<round>\d+)\.json$")


def rounds(folders: list[Path]) -> dict:
    """{(model, shape): {side: [{column: p50 µs}, ...]}} over every round file in `folders`, in name order."""
    out: dict = defaultdict(lambda: defaultdict(list))
    for path in sorted(p for folder in folders for p in folder.glob("step_host_*_*.json")):
        found = NAME.match(path.name)
        if found is None:
            continue
        for shape, phases in json.loads(path.read_text())["results"].items():
            p50 = {name: value["p50_us"] for name, value in phases.items()}
            row = {"before replay": sum(p50[name] for name in BEFORE_REPLAY), **p50}
            out[(found["model"], shape)][found["side"]].append(row)
    return out


def table(data: dict) -> list[str]:
    lines = ["model, shape | " + " | ".join(COLUMNS) + " | host to host by round (base; head)"]
    for (model, shape), sides in data.items():
        if not sides.get("base") or not sides.get("head"):
            continue
        cells = [f"{statistics.median(r[c] for r in sides['base']):.1f} -> "
                 f"{statistics.median(r[c] for r in sides['head']):.1f}" for c in COLUMNS]
        by_round = "; ".join(" / ".join(f"{r['host_to_host']:.0f}" for r in sides[s]) for s in ("base", "head"))
        lines.append(f"{model} {shape} | " + " | ".join(cells) + f" | {by_round}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    args = parser.parse_args()
    print("\n".join(table(rounds(args.folders))))
    print("µs: the median over the rounds of each side's p50; base -> head")


if __name__ == "__main__":
    main()
