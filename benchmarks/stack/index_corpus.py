"""The index benchmark's corpus (many documents, fast) and its exactly-once check of an `ivy index` output.

Documents: slices of the bundled corpus's token stream (benchmarks/stack/corpus.py's text, tokenized once
without special tokens), each starting at a seeded position and `n - specials` tokens long, n drawn from
the lognormal (median 128, clipped), its text the characters those tokens cover. Re-tokenized, a slice
counts n tokens give or take one at its edges: exact cutting (corpus.DocumentMaker, several encodes per
document) would take minutes for 200 k documents, this takes seconds. Ids are `doc-0000000`, ...
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.stack.corpus import Corpus, lognormal_lengths


@dataclass(frozen=True)
class Documents:
    texts: list[str]
    nominal_tokens: int  # the drawn lengths' sum (special tokens included)
    describe: dict[str, Any]


def doc_id(i: int) -> str:
    return f"doc-{i:07d}"


def make_documents(model_dir: str, count: int, seed: int, mu: float = math.log(128), sigma: float = 0.8,
                   lo: int = 16, hi: int = 512) -> Documents:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    corpus = Corpus.load()
    text = "\n\n".join(corpus.paragraphs)
    offsets = tok.encode(text, add_special_tokens=False).offsets
    specials = len(tok.encode("").ids)
    rng = random.Random(f"{seed}:index")
    lengths = lognormal_lengths(rng, count, mu, sigma, max(lo, specials + 1), hi)
    texts = []
    for n in lengths:
        k = min(n - specials, len(offsets))
        start = rng.randrange(len(offsets) - k + 1)
        texts.append(text[offsets[start][0]: offsets[start + k - 1][1]])
    facts = {"corpus": corpus.describe(), "documents": count, "seed": seed, "lognormal": [mu, sigma, lo, hi],
             "method": "slices of the corpus token stream (+-1 token at the edges)", "corpus_tokens": len(offsets)}
    return Documents(texts, sum(lengths), facts)


def write_jsonl(path: Path, texts: list[str], count: int | None = None) -> Path:
    """The first `count` (all) texts as {"id", "text"} lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(texts[:count]):
            f.write(json.dumps({"id": doc_id(i), "text": text}, ensure_ascii=False) + "\n")
    return path


def exactly_once(folder: Path, count: int) -> dict[str, Any]:
    """Every id doc-0..count-1 once in the shards or rejects.jsonl of `folder`: none missing, none twice."""
    import pyarrow.parquet as pq

    ids: list[str] = []
    for shard in sorted(folder.glob("part-*.parquet")):
        ids += pq.read_table(shard, columns=["id"]).column("id").to_pylist()
    rejects = folder / "rejects.jsonl"
    rejected = [json.loads(line)["id"] for line in rejects.read_text().splitlines()] if rejects.exists() else []
    seen = ids + rejected
    unique = set(seen)
    expected = {doc_id(i) for i in range(count)}
    out = {"expected": count, "rows": len(ids), "rejected": len(rejected), "missing": len(expected - unique),
           "twice": len(seen) - len(unique), "unexpected": len(unique - expected),
           "complete": json.loads((folder / "manifest.json").read_text()).get("complete", False)}
    out["ok"] = out["complete"] and out["missing"] == out["twice"] == out["unexpected"] == 0
    return out
