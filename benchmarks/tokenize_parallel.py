"""One long text tokenized on one thread vs split at safe boundaries and encoded on several (ivy.split_encode).

    python -m benchmarks.tokenize_parallel [--model-dir DIR] [--threads 1,2,4,8] [--runs 100] [--json PATH]

Texts (from benchmarks/corpus): one of exactly 4096 tokens with the model's specials, and one of 16 000
characters. For each, the median (and p10/p90) over `--runs` of:
  offsets        tokenizers' encode() with offsets and specials (what a naive gateway calls)
  plain          rose Tokenizer.encode_batch: the fast path without offsets, one thread (Ivy today); for a
                 tokenizer with a word cache (BERT's, a Qwen3-style BPE) its warm lookups
  no cache       the same with the word cache off: tokenizers' own encode, one thread
  serial xP      the split path's pieces (P = max threads) encoded one after another on one thread:
                 what splitting itself costs
  pool T         SplitEncoder with T threads: T pieces spread over a T-thread pool (what Ivy does; a text the
                 word cache takes is not cut, as in Ivy)
  rust T         the T pieces (cut even where the word cache would take the text whole) in one encode_batch
                 call (parallel inside tokenizers, over rayon's pool of RAYON_NUM_THREADS or all cores, unless
                 TOKENIZERS_PARALLELISM=false)
Every variant's ids are checked equal to `plain` first. No truncation (max_length 2^30): all tokens count.
Variants are interleaved, in a shuffled order each round. Ivy's default is rust while TOKENIZERS_PARALLELISM
allows it, else pool, both with T = --tokenizer-threads (default min(8, CPUs)).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ivy.split_encode import SplitEncoder, cut, split_rule
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer

CORPUS = Path(__file__).resolve().parent / "corpus" / "stdlib_docstrings.txt"
HUGE = 1 << 30


def texts_for(tok: Tokenizer, tokens: int = 4096, chars: int = 16_000) -> dict[str, str]:
    """A text of exactly `tokens` tokens (specials included; bisection on characters) and one of `chars`."""
    corpus = CORPUS.read_text()
    while len(corpus) < 8 * max(chars, 8 * tokens):
        corpus += "\n\n" + corpus
    lo, hi = 1, 8 * tokens
    count = lambda n: len(tok.encode(corpus[:n], HUGE).ids)  # noqa: E731
    while lo < hi:
        mid = (lo + hi) // 2
        if count(mid) < tokens:
            lo = mid + 1
        else:
            hi = mid
    return {f"{tokens} tokens": corpus[:lo], f"{chars} chars": corpus[:chars]}


def _time(variants: dict, runs: int) -> dict[str, dict[str, float]]:
    """Each variant `runs` times, interleaved in a shuffled order per round (drift hits all alike)."""
    rng = random.Random(0)
    samples: dict[str, list[float]] = {label: [] for label in variants}
    for r in range(max(3, runs // 10) + runs):
        order = list(variants)
        rng.shuffle(order)
        for label in order:
            start = time.perf_counter()
            variants[label]()
            if r >= max(3, runs // 10):
                samples[label].append((time.perf_counter() - start) * 1e3)
    out = {}
    for label, xs in samples.items():
        xs.sort()
        out[label] = {"p50_ms": statistics.median(xs), "p10_ms": xs[len(xs) // 10], "p90_ms": xs[(9 * len(xs)) // 10]}
    return out


def run(model_dir: Path, threads: list[int], runs: int) -> dict:
    spec = load_spec(model_dir)
    tok = Tokenizer(spec)
    uncached = Tokenizer(spec, cache_words=0) if tok.word_cache is not None else None
    rule = split_rule(tok)
    pools = {t: ThreadPoolExecutor(t) for t in threads if t > 1}
    out: dict = {"env": {"model_dir": str(model_dir), "rule": rule, "cpu_count": os.cpu_count(),
                         "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                         "tokenizers": __import__("tokenizers").__version__, "python": platform.python_version(),
                         "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM"),
                         "RAYON_NUM_THREADS": os.environ.get("RAYON_NUM_THREADS"), "runs": runs},
                 "texts": {}}
    for name, text in texts_for(tok).items():
        plain_ids = tok.encode_batch([text], HUGE)[0].ids
        variants = {"offsets": lambda: tok.hf.encode(text).ids,
                    "plain": lambda: tok.encode_batch([text], HUGE)[0].ids}
        if uncached is not None:  # plain is the word cache's path (warm after the first run): tokenizers' beside it
            variants["no cache"] = lambda t=text: uncached.encode_batch([t], HUGE)[0].ids
        if rule is not None:
            serial = cut(text, rule, max(threads))

            def serial_fn(pieces=serial):
                encs = [e for p in pieces for e in tok.content_encodings([p])]
                return tok.finish(tok.merge(encs), HUGE).ids
            variants[f"serial x{len(serial)}"] = serial_fn
            for t in threads:
                if t == 1:
                    continue
                splitter = SplitEncoder(tok, pools[t], t, split_chars=1, piece_chars=1)
                pieces = splitter.pieces(text, whole_ok=False)  # cut even where the word cache takes it whole
                variants[f"pool {t}"] = lambda s=splitter: s.encode_batch([text], HUGE)[0].ids
                variants[f"rust {t}"] = lambda p=pieces: tok.finish(tok.merge(tok.content_encodings(p)), HUGE).ids
        for label, fn in variants.items():
            assert fn() == plain_ids, (name, label)
        rows = _time(variants, runs)
        out["texts"][name] = {"chars": len(text), "tokens": len(plain_ids), "results": rows}
    for pool in pools.values():
        pool.shutdown()
    return out


def table(result: dict) -> str:
    env = result["env"]
    lines = [f"tokenizers {env['tokenizers']}, {env['cpu_count']} CPUs ({env['affinity']} usable), rule "
             f"{env['rule']}, median of {env['runs']} runs (p10-p90)"]
    for name, text in result["texts"].items():
        plain = text["results"]["plain"]["p50_ms"]
        lines.append(f"\n{name}: {text['chars']} chars, {text['tokens']} tokens")
        lines.append(f"  {'variant':<12} {'p50 ms':>8} {'p10-p90 ms':>14} {'vs plain':>9} {'Mtok/s':>7}")
        for label, r in text["results"].items():
            lines.append(f"  {label:<12} {r['p50_ms']:8.2f} {r['p10_ms']:6.2f}-{r['p90_ms']:<7.2f} "
                         f"{plain / r['p50_ms']:8.2f}x {text['tokens'] / r['p50_ms'] / 1e3:7.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", type=Path, default=None, help="model folder (default: bundled MiniLM)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    model_dir = args.model_dir
    if model_dir is None:
        try:
            model_dir = bundled_model_dir()
        except Exception:  # no bundled package (a bare GPU host): the same tokenizer from the assets
            model_dir = Path(__file__).resolve().parent / "assets" / "minilm-l6"
    result = run(model_dir, [int(t) for t in args.threads.split(",")], args.runs)
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
