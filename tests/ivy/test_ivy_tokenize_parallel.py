"""Long texts split at safe boundaries and encoded on several threads: ids identical to the plain encode
(`tokenizers` itself, truncation on both sides keeping the specials), on MiniLM's WordPiece and on
byte-level BPEs built the way Qwen3 (Split regex + ByteLevel), Llama-3 and GPT-2 tokenizers are; anything
not proven safe is encoded whole."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import random
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Regex, Tokenizer as HFTokenizer

from ivy import split_encode
from ivy.split_encode import SplitEncoder, cut, split_rule
from ivy.token_texts import TokenTexts
from ivy.tokenization import InputEncoder
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer

CORPUS = (Path(__file__).resolve().parents[2] / "benchmarks" / "corpus" / "stdlib_docstrings.txt").read_text()
TRICKY = ["  ", "   ", "\n", "\n\n", "\t", "\r\n", " \t ", "東京は", "日本語のテキスト", "🚀", "👩‍👩‍👧", "café",
          "naïve", "e\u0301", " \u0301", "´", "\u00a0", "\u3000", "it's", "we'll", "[SEP]", "<|endoftext|>",
          "12345", "x=1;", "ΟΔΟΣ", "Ünïcødé", "\x07", "\u200b", "--", "...", "İstanbul"]


def _tokenizer(data: dict, tmp: Path, name: str, max_length: int = 512) -> Tokenizer:
    folder = tmp / name
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(data))
    spec = load_spec(bundled_model_dir())
    # without the word cache, which takes an ASCII text whole (tests/rose/test_rose_ascii_bpe.py)
    return Tokenizer(dataclasses.replace(spec, model_dir=folder, max_length=max_length), cache_words=0)


@pytest.fixture(scope="module")
def bpe_json() -> dict:
    """A byte-level BPE trained here on the corpus, with Qwen3's normalizer, pre-tokenizer and EOS suffix."""
    from tokenizers import models, normalizers, pre_tokenizers, processors, trainers

    tok = HFTokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split_encode._QWEN2), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=["<|endoftext|>", "<|im_start|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([CORPUS[:200_000], "東京は日本語のテキスト café naïve 🚀"], trainer)
    tok.post_processor = processors.TemplateProcessing(single="$A <|endoftext|>",
                                                       special_tokens=[("<|endoftext|>", 0)])
    return json.loads(tok.to_str())


@pytest.fixture(scope="module")
def tokenizers_(bpe_json: dict, tmp_path_factory) -> dict[str, Tokenizer]:
    tmp = tmp_path_factory.mktemp("split")
    llama = json.loads(json.dumps(bpe_json))
    llama["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = split_encode._LLAMA3
    gpt2 = json.loads(json.dumps(bpe_json))
    gpt2["normalizer"] = None
    gpt2["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    gpt2["post_processor"] = {"type": "TemplateProcessing", "single": [
        {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
        {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}], "pair": [], "special_tokens": {
        "<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]},
        "<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}}
    # MiniLM without its word cache, which takes every ASCII text whole (tests/rose/test_rose_word_cache.py)
    return {"minilm": Tokenizer(load_spec(bundled_model_dir()), cache_words=0), "qwen3": _tokenizer(bpe_json, tmp, "qwen3"),
            "llama3": _tokenizer(llama, tmp, "llama3"), "gpt2": _tokenizer(gpt2, tmp, "gpt2")}


@pytest.fixture(scope="module")
def pool():
    with ThreadPoolExecutor(3) as p:
        yield p


@functools.lru_cache(maxsize=None)
def _hf(tok: Tokenizer, max_length: int, side: str) -> HFTokenizer:
    hf = HFTokenizer.from_str(tok.hf.to_str())
    hf.enable_truncation(max_length, direction=side)
    return hf


def _reference(tok: Tokenizer, text: str, max_length: int, side: str) -> list[int]:
    """The model's tokenizer itself, truncating the way HF does (the specials kept)."""
    return _hf(tok, max_length, side).encode(text).ids


def _check(tok: Tokenizer, splitter: SplitEncoder, texts: list[str], max_length: int, side: str) -> None:
    got = splitter.encode_batch(texts, max_length, side)
    plain = tok.encode_batch(texts, max_length, side)
    assert got == plain
    for text, enc in zip(texts, got):
        assert enc.ids == _reference(tok, text, max_length, side)


def _long_text(rng: random.Random, chars: int) -> str:
    start = rng.randrange(len(CORPUS) - chars)
    words = CORPUS[start:start + chars].split(" ")
    return " ".join(w + rng.choice(TRICKY) if rng.random() < 0.15 else w for w in words)


def test_mode_follows_tokenizers_parallelism(monkeypatch, pool) -> None:
    splitter = SplitEncoder(Tokenizer(load_spec(bundled_model_dir())), pool, 4)
    assert splitter.rule == "ws" and splitter._rust()
    for value, rust in (("false", False), ("0", False), ("OFF", False), ("true", True), ("1", True)):
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", value)
        assert splitter._rust() == rust


def test_rules_of_byte_level_models(tokenizers_: dict[str, Tokenizer]) -> None:
    assert {n: split_rule(t) for n, t in tokenizers_.items()} == {
        "minilm": "ws", "qwen3": "space", "llama3": "space", "gpt2": "space"}


@pytest.mark.parametrize("name", ["minilm", "qwen3", "llama3", "gpt2"])
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("mode", ["rust", "pool"])
def test_long_texts_match_the_plain_encode(tokenizers_, pool, name: str, side: str, mode: str) -> None:
    tok = tokenizers_[name]
    splitter = SplitEncoder(tok, pool, 16, split_chars=300, piece_chars=100, mode=mode)  # 8 texts: under 16, split
    rng = random.Random(zlib.crc32(f"{name}{side}".encode()))
    texts = [_long_text(rng, 3000) for _ in range(4)] + [" ".join(TRICKY * 20), "a  b\t\tc\n\nd " * 200,
                                                         "\n".join(TRICKY * 20), "short one"]
    assert all(splitter.pieces(t) for t in texts[:6])
    assert bool(splitter.pieces(texts[6])) == (name == "minilm")  # no space between two visible characters
    for max_length in (10**6, 64, 3):
        _check(tok, splitter, texts, max_length, side)


@pytest.mark.parametrize("name", ["minilm", "qwen3", "gpt2"])
def test_randomized(tokenizers_, pool, name: str) -> None:
    tok = tokenizers_[name]
    rng = random.Random(1234)
    split = 0
    splitter = SplitEncoder(tok, pool, 2)
    for _ in range(150):
        frags = [rng.choice(TRICKY) if rng.random() < 0.4 else CORPUS[(i := rng.randrange(len(CORPUS) - 40)):
                                                                     i + rng.randrange(1, 40)]
                 for _ in range(rng.randrange(1, 60))]
        text = "".join(frags)
        splitter.threads, splitter.split_chars = rng.choice([2, 3, 8]), rng.randrange(0, 200)
        splitter.piece_chars, splitter.mode = rng.randrange(1, 100), rng.choice(["rust", "pool"])
        split += bool(splitter.pieces(text))
        side = rng.choice(["right", "left"])
        _check(tok, splitter, [text], rng.choice([10**6, 5, 40]), side)
    assert split > 100


@pytest.mark.parametrize("name", ["minilm", "qwen3"])
def test_no_whitespace_and_threshold(tokenizers_, pool, name: str) -> None:
    tok = tokenizers_[name]
    splitter = SplitEncoder(tok, pool, 4, split_chars=400, piece_chars=100)
    for text in ("東京は日本語のテキスト" * 100, "a" * 1000, "🚀" * 500, "x,y;" * 300):
        assert splitter.pieces(text) is None
        _check(tok, splitter, [text], 10**6, "right")
    at = ("word " * 100)[:400]
    assert splitter.pieces(at) is None and splitter.pieces(at + "x")
    _check(tok, splitter, [at, at + "x"], 50, "left")
    # Byte-level: a space next to a mark, a control, or a character decomposing to a space is no boundary.
    if name == "qwen3":
        assert cut("ab \u0301cd", "space", 2) is None and cut("ab´ cd", "space", 2) is None
        assert cut("a  b", "space", 2) is None and cut("ab cd", "space", 2) == ["ab", " cd"]


def test_unrecognized_tokenizers_are_not_split(bpe_json: dict, tmp_path: Path, pool) -> None:
    def variant(i: int, edit) -> Tokenizer:
        data = json.loads(json.dumps(bpe_json))
        edit(data)
        return _tokenizer(data, tmp_path, f"v{i}")

    edits = [
        lambda d: d["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex=r"\w+|\s+"),
        lambda d: d.update(pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                                          "split": True}),
        lambda d: d.update(pre_tokenizer=None),
        lambda d: d.update(normalizer={"type": "Strip", "strip_left": True, "strip_right": True}),
        lambda d: d.update(normalizer={"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                                       "strip_accents": None, "lowercase": True}),
        lambda d: d["added_tokens"][1].update(rstrip=True),
        lambda d: d["added_tokens"][1].update(content="<|im start|>"),
        lambda d: d["model"].update(dropout=0.1),
    ]
    text = _long_text(random.Random(5), 5000)
    for i, edit in enumerate(edits):
        tok = variant(i, edit)
        splitter = SplitEncoder(tok, pool, 4, split_chars=100)
        assert split_rule(tok) is None and splitter.pieces(text) is None, i
        if i != 7:  # dropout is random by design
            assert splitter.encode_batch([text], 128) == tok.encode_batch([text], 128)
    # Why rstrip is refused: forced, the split would give other ids (the token eats the space only whole).
    forced = SplitEncoder(variant(99, edits[5]), pool, 4, split_chars=100, piece_chars=50)
    forced.rule = "space"
    text = "foo<|im_start|> bar " * 100
    assert forced.encode_batch([text], 10**6) != forced.tokenizer.encode_batch([text], 10**6)


def test_input_encoder_spreads_a_long_text_and_batches_short_ones(monkeypatch) -> None:
    spec = load_spec(bundled_model_dir())
    tok = Tokenizer(spec, cache_words=0)  # the word cache would take the ASCII texts whole (and not call the spy)
    enc = InputEncoder(spec, tok, threads=4, char_cap=10**6, inline_chars=0, split_chars=4000, piece_chars=1000)
    calls: list[tuple[str, int]] = []
    real = tok.content_encodings

    def spy(texts):
        calls.append((threading.current_thread().name, len(texts)))
        return real(texts)

    monkeypatch.setattr(tok, "content_encodings", spy)
    long_text = _long_text(random.Random(9), 20000)

    async def encode(texts, side):  # int32 arrays, as lists to compare
        out = await enc.encode_texts(texts, truncate=True, side=side)
        assert all(isinstance(ids, np.ndarray) and ids.dtype == np.int32 for ids in out)
        return [ids.tolist() for ids in out]

    async def main():
        many = await encode(["hello world"] * 50, "right")
        assert len(calls) == 1 and many == [e.ids for e in tok.encode_batch(["hello world"] * 50)]
        calls.clear()
        got = await encode([long_text], "left")
        assert calls == [(calls[0][0], 4)] and got == [_reference(tok, long_text, spec.max_length, "left")]
        enc.splitter.mode = "pool"  # the pieces on the encoder's threads, one call each
        calls.clear()
        got = await encode([long_text], "left")
        assert len(calls) == 4 and sum(n for _, n in calls) == 4
        assert got == [_reference(tok, long_text, spec.max_length, "left")]
        assert await TokenTexts(enc).tokenize(long_text) == _reference(tok, long_text, 10**6, "right")
        # Many long requests at once on a 4-thread pool: no deadlock, every answer exact.
        outs = await asyncio.wait_for(asyncio.gather(*(
            encode([long_text, "x"], "right") for _ in range(12))), 60)
        assert all(o[0] == outs[0][0] == _reference(tok, long_text, spec.max_length, "right") for o in outs)

    try:
        asyncio.run(main())
    finally:
        enc.close()


@pytest.mark.parametrize("name", ["minilm", "qwen3", "gpt2"])
def test_fixed_wrap_equals_the_post_processor(tokenizers_, name: str) -> None:
    """Tokenizer.finish adds the post-processor's ids itself; the same as calling it, both sides."""
    tok = tokenizers_[name]
    assert tok._wrap is not None
    texts = [_long_text(random.Random(3), 2000), "", "x", " ".join(TRICKY)]
    fast = [tok.encode_batch(texts, m, side) for m in (10**6, 40, 2) for side in ("right", "left")]
    wrap, tok._wrap = tok._wrap, None
    try:
        assert fast == [tok.encode_batch(texts, m, side) for m in (10**6, 40, 2) for side in ("right", "left")]
    finally:
        tok._wrap = wrap


def test_a_call_of_many_texts_cuts_only_those_over_twice_its_characters_per_thread(tokenizers_, pool, monkeypatch) -> None:
    """encode_batch spreads a call's texts over the cores already: four texts alike on four threads are not cut
    (no pieces, no merging); one long text among short ones is. The same ids either way."""
    tok = tokenizers_["minilm"]
    splitter = SplitEncoder(tok, pool, 4, split_chars=300, piece_chars=100, mode="rust")
    rng = random.Random(3)
    alike = [_long_text(rng, 2000) for _ in range(4)]
    merged: list[int] = []  # pieces per merged text: only the split path merges
    real = tok.merge
    monkeypatch.setattr(tok, "merge", lambda encodings: merged.append(len(encodings)) or real(encodings))
    assert splitter.encode_batch(alike, 10**6) == tok.encode_batch(alike, 10**6) and merged == []
    mixed = [_long_text(rng, 6000), "a short query", "another one", "and a third"]
    _check(tok, splitter, mixed, 10**6, "right")
    assert merged == [4, 1, 1, 1]  # the long one in four pieces (one per thread), the queries whole
