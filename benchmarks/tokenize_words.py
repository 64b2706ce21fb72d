"""What the word cache (rose/word_cache.py) saves a BERT tokenizer's ASCII text, warm, cold, and on first sight.

    python -m benchmarks.tokenize_words [--model-dir DIR | --train-bpe] [--runs 300] [--json PATH]

The bundled all-MiniLM-L6-v2 (WordPiece) by default; --train-bpe measures a Qwen3-style byte-level BPE instead
(NFC, Qwen2's Split regex, ByteLevel, 30 000 merges) trained here on the corpus, since no Qwen3 folder is
bundled (rose/ascii_bpe.py).

Texts from benchmarks/corpus (the stack benchmark's own) of 128, 512 and 4096 tokens. Per text, one text a
call as Ivy's inline tokenizing does, median µs over `--runs` interleaved rounds of:
  tokenizers    `tokenizers`' encode_batch_fast with specials (its own normalizer)
  no cache      rose Tokenizer without the cache (for BERT: its normalizer in Python, rose/ascii_bert.py)
  cache warm    rose Tokenizer with the cache, every word known
  cache cold    another cache emptied before each call (every word new: a short text's encoded in one batch
                call, in groups of ~GROUP_CHARS characters in parallel; a long one's by the plain path, with
                LEARN_PER_CALL of them learned)
  cold 1 group  the same with the new words in one group (one thread inside `tokenizers`)
Then "first sight": the whole corpus in 128-token documents, in order, through a fresh cache of the default
size: the share of words found in the cache (1 - new words / words looked up), and µs per document against the
plain path.
Every variant's ids are checked equal to `tokenizers`' first. Prints one table last.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from benchmarks.tokenize_parallel import CORPUS, _time, texts_for
from rose import ascii_bert
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer

HUGE = 1 << 30


def _median_us(variants: dict, runs: int) -> dict[str, float]:
    """Median µs of each variant, interleaved in a shuffled order per round (benchmarks.tokenize_parallel)."""
    return {label: t["p50_ms"] * 1e3 for label, t in _time(variants, runs).items()}


def first_sight(model_dir: Path, tokens: int = 128) -> dict:
    """The corpus cut in `tokens`-token documents, each encoded once, in order, through a fresh cache."""
    spec = load_spec(model_dir)
    cached, plain = Tokenizer(spec), Tokenizer(spec, cache_words=0)
    words = CORPUS.read_text().split(" ")
    step = int(tokens * 0.6)  # ~0.6 words a token in this corpus (benchmarks/stack/corpus.py)
    docs = [" ".join(words[i:i + step]) for i in range(0, len(words) - step, step)]
    cache = cached.word_cache
    t_cached = t_plain = 0.0
    for doc in docs:
        t0 = time.perf_counter()
        a = cached.encode_batch([doc], HUGE)
        t1 = time.perf_counter()
        b = plain.encode_batch([doc], HUGE)
        t_plain += time.perf_counter() - t1
        t_cached += t1 - t0
        assert a == b
    known = 1 - cache.new / max(1, cache.words)
    return {"documents": len(docs), "known_share": known, "words_remembered": len(cache),
            "cache_us_per_doc": t_cached / len(docs) * 1e6, "no_cache_us_per_doc": t_plain / len(docs) * 1e6}


def qwen_style_bpe(texts: list[str], regex: str | None = None, vocab_size: int = 30_000):
    """A `tokenizers` byte-level BPE built as Qwen3's is (NFC, a Split regex: Qwen2's unless `regex`, ByteLevel
    without its own regex, "<|endoftext|>" after the content), trained on `texts`."""
    from tokenizers import (
        Regex,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from tokenizers import Tokenizer as HF

    from ivy.split_encode import _QWEN2

    tok = HF(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex or _QWEN2), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(single="$A <|endoftext|>",
                                                       special_tokens=[("<|endoftext|>", 0)])
    return tok


def train_bpe(folder: Path) -> Path:
    """A model folder like the bundled one whose tokenizer.json is a Qwen3-style BPE trained on the corpus."""
    import shutil

    from benchmarks.model_zoo import qwen_bpe

    shutil.copytree(bundled_model_dir(), folder, dirs_exist_ok=True)
    qwen_bpe().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").unlink(missing_ok=True)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default=None, help="a BERT-family folder (default: the bundled model; "
                        "benchmarks/assets/minilm-l6 holds its tokenizer where the package is not installed)")
    parser.add_argument("--train-bpe", action="store_true", help="a Qwen3-style byte-level BPE trained here")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    model_dir = Path(args.model_dir) if args.model_dir else bundled_model_dir()
    if args.train_bpe:
        model_dir = train_bpe(Path(tempfile.mkdtemp(prefix="bpe-")))
    spec = load_spec(model_dir)
    cached, plain = Tokenizer(spec), Tokenizer(spec, cache_words=0)
    emptied = Tokenizer(spec)  # the cold variants' own cache, emptied before each call (the warm one stays warm)
    if cached.word_cache is None:
        raise SystemExit(f"{model_dir}: not a tokenizer the word cache takes (rose/ascii_bert.py, rose/ascii_bpe.py)")
    hf = cached.hf
    records = []
    for tokens in (128, 512, 4096):
        text = texts_for(plain, tokens)[f"{tokens} tokens"].encode("ascii", "replace").decode()
        want = hf.encode_batch_fast([text])[0].ids
        assert cached.encode_batch([text], HUGE)[0].ids == want == plain.encode_batch([text], HUGE)[0].ids
        while cached.word_cache.content_ids([cached._cached.normalized(text)]) is None:
            pass  # a long text is learned over a few calls (rose.word_cache.LEARN_PER_CALL)

        def cold(t=text):
            emptied.word_cache._ids.clear()  # deliberate: every word new again
            emptied.encode_batch([t], HUGE)

        def cold_one_group(t=text):  # the module's group size, changed for the call (single-threaded script)
            group, ascii_bert.GROUP_CHARS = ascii_bert.GROUP_CHARS, HUGE
            try:
                cold(t)
            finally:
                ascii_bert.GROUP_CHARS = group

        us = _median_us({"tokenizers": lambda t=text: hf.encode_batch_fast([t]),
                         "no cache": lambda t=text: plain.encode_batch([t], HUGE),
                         "cache warm": lambda t=text: cached.encode_batch([t], HUGE),
                         "cache cold": cold, "cold 1 group": cold_one_group}, args.runs if tokens < 4096 else max(30, args.runs // 5))
        records.append({"tokens": len(want), "chars": len(text), **{k.replace(" ", "_") + "_us": v for k, v in us.items()}})
    sight = first_sight(model_dir)
    env = {"python": platform.python_version(), "machine": platform.machine(), "host": platform.node()}
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "records": records, "first_sight": sight}, indent=1))
    print(f"first sight: {sight['documents']} documents of ~128 tokens in order, {sight['known_share']:.1%} of "
          f"their words found in the cache, {sight['words_remembered']} remembered; "
          f"{sight['cache_us_per_doc']:.1f} µs a document vs {sight['no_cache_us_per_doc']:.1f} without the cache")
    print(f"{'tokens':>7s} {'chars':>6s} {'tokenizers':>11s} {'no cache':>11s} {'cache warm':>11s} {'cache cold':>11s}"
          f" {'cold 1 group':>13s}   (µs, median)")
    for r in records:
        print(f"{r['tokens']:7d} {r['chars']:6d} {r['tokenizers_us']:11.1f} {r['no_cache_us']:11.1f} "
              f"{r['cache_warm_us']:11.1f} {r['cache_cold_us']:11.1f} {r['cold_1_group_us']:13.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
