"""`python -m benchmarks.bert_normalizer`: what BERT's normalizer costs a text, and rose.ascii_bert's path.

The bundled all-MiniLM-L6-v2's tokenizer (a BertNormalizer, as every BERT-family model's) encodes ASCII texts
of about 128, 512 and 4096 tokens (content only, one text a call, as Ivy's inline tokenizing does) two ways
in one process: `tokenizers` with its own normalizer, and ROSE's Tokenizer, which normalizes ASCII in Python
and encodes with a copy of the tokenizer without it (rose/ascii_bert.py). Median µs of alternating rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time

from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer

SENTENCE = ("The gateway tokenizes each request's texts, splits large batches into chunks and spreads them over "
            "the replicas; Tulip packs sequences into token-budget batches while ROSE runs the model. ")


def median_us(fn, rounds: int) -> float:
    for _ in range(max(20, rounds // 10)):
        fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default=None, help="a BERT-family folder (default: the bundled model; "
                        "benchmarks/assets/minilm-l6 holds its tokenizer where the package is not installed)")
    args = parser.parse_args(argv)
    ours = Tokenizer(load_spec(args.model_dir or bundled_model_dir()))
    hf = ours.hf
    plain = getattr(hf, "encode_batch_fast", hf.encode_batch)
    print(f"{'tokens':>7s} {'chars':>6s} {'tokenizers µs':>14s} {'ascii path µs':>14s} {'saved µs':>9s}")
    for target in (128, 512, 4096):
        text = SENTENCE * (target // 30 + 1)
        while len(plain([text], add_special_tokens=False)[0].ids) > target:
            text = text[: int(len(text) * 0.97)]
        n = len(plain([text], add_special_tokens=False)[0].ids)
        assert ours.content_encodings([text])[0].ids == plain([text], add_special_tokens=False)[0].ids
        rounds = 2000 if target <= 512 else 300
        a, b = [], []
        for _ in range(3):
            a.append(median_us(lambda t=text: plain([t], add_special_tokens=False), rounds))
            b.append(median_us(lambda t=text: ours.content_encodings([t]), rounds))
        old, new = statistics.median(a), statistics.median(b)
        print(f"{n:7d} {len(text):6d} {old:14.1f} {new:14.1f} {old - new:9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
