"""Progress: a tqdm bar (documents/s, tokens/s, ETA) on a terminal, plain log lines elsewhere, and the summary.

Rates count only what is committed or rejected in this run; a resumed run starts them at zero and its bar at
the documents already committed. The summary's documents, rejects and tokens are the whole output's: what the
manifest held when this run started plus this run's (`this_run`).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass

log = logging.getLogger("ivy.index")


@dataclass
class Totals:
    docs: int = 0  # embedded (in a committed shard)
    rejects: int = 0
    tokens: int = 0


class Progress:
    def __init__(self, mode: str, total: int | None, done: int, interval_s: float,
                 earlier: tuple[int, int, int] = (0, 0, 0)) -> None:
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "log"
        self.mode, self.total, self.done, self.interval_s = mode, total, done, interval_s
        self.run, self.earlier = Totals(), Totals(*earlier)
        self.start = self._last = time.monotonic()
        self._bar = None
        if mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=done, unit="doc", dynamic_ncols=True, smoothing=0.1)

    def rates(self) -> tuple[float, float, float]:
        wall = max(time.monotonic() - self.start, 1e-9)
        return wall, (self.run.docs + self.run.rejects) / wall, self.run.tokens / wall

    def update(self, docs: int, rejects: int, tokens: int) -> None:
        self.run.docs += docs
        self.run.rejects += rejects
        self.run.tokens += tokens
        self.done += docs + rejects
        wall, dps, tps = self.rates()
        if self._bar is not None:
            self._bar.update(docs + rejects)
            self._bar.set_postfix_str(f"{tps:,.0f} tok/s, {self.run.rejects} rejected", refresh=False)
        elif self.mode == "log" and time.monotonic() - self._last >= self.interval_s:
            self._last = time.monotonic()
            left = (self.total - self.done) / dps if self.total and dps else None
            log.info("%s documents%s, %.0f docs/s, %.0f tokens/s, %d rejected%s", f"{self.done:,}",
                     f" of {self.total:,}" if self.total else "", dps, tps, self.run.rejects,
                     f", ETA {left:.0f} s" if left is not None else "")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def summary(self, gpu_hour_price: float, gpus: int) -> dict:
        wall, dps, tps = self.rates()
        cost = gpu_hour_price * gpus * wall / 3600
        run, earlier = self.run, self.earlier
        return {"documents": earlier.docs + run.docs, "rejected": earlier.rejects + run.rejects,
                "tokens": earlier.tokens + run.tokens,
                "this_run": {"documents": run.docs, "rejected": run.rejects, "tokens": run.tokens},
                "wall_s": round(wall, 3), "documents_per_s": round(dps, 1), "tokens_per_s": round(tps, 1),
                "usd_per_million_tokens": round(cost / run.tokens * 1e6, 4) if run.tokens else None,
                "gpu_hour_price": gpu_hour_price, "gpus": gpus}


def print_summary(summary: dict, out=None) -> None:
    cost, run = summary["usd_per_million_tokens"], summary["this_run"]
    resumed = run["documents"] + run["rejected"] != summary["documents"] + summary["rejected"]
    print(f"ivy index: {summary['documents']:,} documents embedded, {summary['rejected']:,} rejected, "
          f"{summary['tokens']:,} tokens"
          + (f"; this run: {run['documents']:,} documents, {run['rejected']:,} rejected, {run['tokens']:,} tokens"
             if resumed else "")
          + f" in {summary['wall_s']:.1f} s ({summary['documents_per_s']:,.0f} docs/s, "
          f"{summary['tokens_per_s']:,.0f} tokens/s)"
          + (f"; ${cost:.4f} per million tokens at ${summary['gpu_hour_price']:g}/GPU-hour x {summary['gpus']}"
             if cost is not None else ""), file=out or sys.stderr, flush=True)  # the current stderr, not import's
