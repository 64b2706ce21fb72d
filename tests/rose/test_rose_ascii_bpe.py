"""rose.ascii_bpe: a Qwen3-style byte-level BPE (NFC, the Qwen2 or Llama-3 Split regex, ByteLevel, BPE) on ASCII
text, its pieces' ids remembered, gives exactly the ids of `tokenizers` itself: on random ASCII (every control
character, whitespace runs, contractions in any case, digit runs), with truncation from both sides, a small cache
emptying as it goes, and mixed calls; other tokenizers and texts keep the plain path."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
from tokenizers import Regex
from tokenizers import Tokenizer as HFTokenizer

from ivy import split_encode
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer
from tests.rose.test_rose_word_cache import each

CORPUS = (Path(__file__).resolve().parents[2] / "benchmarks" / "corpus" / "stdlib_docstrings.txt").read_text()
PIECES = ["hello", "World", " it's", "IT'S", "we'LL", "you'Re", "'d", "x86_64", "12345678", "3.14", "  ", "\t", "\r", " \r ",
          "\n", "\r\n", "\n\n\n", " \n ", "\x0b", "\x0c", "\x1c", "\x01", "\x7f", "!!", "?!\n", "--", "...", "'",
          "<|endoftext|>", "<|im_start|>", "   x", "a  b", "(x)", "[y]", "{z}", "$5", "@home", "#tag", "~"]


def random_ascii(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return "".join(chr(rng.randrange(128)) for _ in range(rng.randrange(0, 80)))
    return "".join(rng.choice(PIECES + [" "] * 8) for _ in range(rng.randrange(0, 50)))


def _train(regex: str) -> dict:
    from benchmarks.tokenize_words import qwen_style_bpe

    digits = " ".join(str(n * 7919 % 100_000) for n in range(3000))  # so that merges of digits exist
    return json.loads(qwen_style_bpe([CORPUS[:100_000], digits], regex, vocab_size=2000).to_str())


@pytest.fixture(scope="module")
def qwen_json() -> dict:
    return _train(split_encode._QWEN2)


def _tokenizer(data: dict, tmp: Path, cache_words: int = 1 << 16, **kwargs) -> Tokenizer:
    tmp.mkdir(exist_ok=True)
    (tmp / "tokenizer.json").write_text(json.dumps(data))
    spec = dataclasses.replace(load_spec(bundled_model_dir()), model_dir=tmp, max_length=10**6)
    return Tokenizer(spec, cache_words=cache_words, **kwargs)


def _reference(tok: Tokenizer) -> HFTokenizer:
    ref = HFTokenizer.from_file(str(tok.spec.model_dir / "tokenizer.json"))
    ref.no_truncation()
    ref.no_padding()
    return ref


@pytest.mark.parametrize("regex", ["qwen2", "llama3"])
def test_ids_equal_the_tokenizers_own(qwen_json, tmp_path, regex) -> None:
    data = json.loads(json.dumps(qwen_json))
    if regex == "llama3":
        data["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = split_encode._LLAMA3
    tok = _tokenizer(data, tmp_path / regex)
    assert tok.word_cache is not None
    ref = _reference(tok)
    rng = random.Random(3)
    texts = [random_ascii(rng) for _ in range(1500)] + [CORPUS[i:i + 700] for i in range(0, 60_000, 3000)]
    want = [e.ids for e in ref.encode_batch(texts)]
    for _ in range(2):  # cold, then warm
        got = [e.ids for e in each(tok, texts)]
        for text, g, w in zip(texts, got, want):
            assert g == w, repr(text)
    assert len(tok.word_cache) > 500


@pytest.mark.parametrize("side", ["right", "left"])
def test_truncation_and_a_small_cache(qwen_json, tmp_path, side) -> None:
    tok, plain = _tokenizer(qwen_json, tmp_path / "a", cache_words=9), _tokenizer(qwen_json, tmp_path / "b", 0)
    assert plain.word_cache is None
    rng = random.Random(4)
    texts = [random_ascii(rng) for _ in range(300)] + ["Café naïve", "東京 tower", "x <|im_start|> y"]
    for limit in (2, 7, 40):
        assert each(tok, texts, max_length=limit, side=side) == plain.encode_batch(texts, max_length=limit, side=side)
        assert len(tok.word_cache) <= 9


@pytest.mark.parametrize("edit", [
    lambda d: d.update(normalizer={"type": "Lowercase"}),
    lambda d: d["pre_tokenizer"]["pretokenizers"][1].update(use_regex=True),
    lambda d: d["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex=r"\s+"),
    lambda d: d["pre_tokenizer"]["pretokenizers"][0].update(behavior="Removed"),
    lambda d: d["model"].update(dropout=0.1),
    lambda d: d["added_tokens"].append({**d["added_tokens"][0], "id": 1999, "content": "two words"}),
])
def test_other_tokenizers_keep_the_plain_path(qwen_json, tmp_path, edit) -> None:
    data = json.loads(json.dumps(qwen_json))
    edit(data)
    assert _tokenizer(data, tmp_path / "m").word_cache is None


def test_a_call_of_mostly_new_pieces_takes_the_plain_path(qwen_json, tmp_path) -> None:
    tok = _tokenizer(qwen_json, tmp_path / "p")
    ref = _reference(tok)
    rng = random.Random(5)
    texts = [random_ascii(rng) for _ in range(400)]
    assert [e.ids for e in tok.encode_batch(texts)] == [e.ids for e in ref.encode_batch(texts)]
    assert 0 < len(tok.word_cache) <= 64


@pytest.mark.parametrize("regex", [split_encode._QWEN2, split_encode._LLAMA3])
def test_pythons_regex_cuts_the_pieces_tokenizers_cuts(regex) -> None:
    import re

    from tokenizers import pre_tokenizers

    from rose.ascii_bpe import _ASCII, taken

    theirs = pre_tokenizers.Split(Regex(regex), behavior="isolated")
    ours = re.compile(_ASCII[regex])
    rng = random.Random(6)
    texts = [random_ascii(rng) for _ in range(8000)] + ["\rhello", "a\r\rb", " \r\nx", "!\r\r\n", "x \r", "1234567 89", "a'S b'll C'VE", " \n\n  x", "x  \n", "\t\t"]
    kept = [t for t in texts if taken(t)]  # the texts rose.ascii_bpe takes
    assert len(kept) > 500
    for text in kept:
        assert ours.findall(text) == [p for p, _ in theirs.pre_tokenize_str(text)], repr(text)


def test_a_text_the_cache_takes_is_encoded_whole_through_it_up_to_the_bound(qwen_json, tmp_path) -> None:
    tok = _tokenizer(qwen_json, tmp_path / "long")
    assert tok.word_cache is not None and tok.bpe_whole_chars == 32768
    assert tok.takes_whole("plain ascii " * 1000)  # 12 000 characters (~3 000 tokens)
    assert not tok.takes_whole("plain ascii " * 3000), "36 000 characters: over the cache's call, in pieces"
    assert not tok.takes_whole("café " * 300), "a text the cache refuses is cut as before"
    bounded = _tokenizer(qwen_json, tmp_path / "bounded", bpe_whole_chars=4096)
    assert bounded.takes_whole("plain ascii " * 300) and not bounded.takes_whole("plain ascii " * 1000)
    never = _tokenizer(qwen_json, tmp_path / "never", bpe_whole_chars=0)
    assert not never.takes_whole("plain ascii " * 300)


def test_encode_warm_gives_encode_batchs_ids_or_nothing_and_learns_only_a_few_new_pieces(qwen_json, tmp_path) -> None:
    tok = _tokenizer(qwen_json, tmp_path / "warm", bpe_whole_chars=20_000)
    ref = _reference(tok)
    rng = random.Random(9)
    texts = [random_ascii(rng) for _ in range(300)]
    answered = 0
    for text in texts:  # one at a time: each learns its few new pieces, or is refused and learns nothing
        held = len(tok.word_cache)
        warm = tok.encode_warm([text], max_new=8)
        if warm is None:
            assert len(tok.word_cache) == held
            tok.encode_batch([text])  # as the pool would, learning them
            continue
        answered += 1
        assert len(tok.word_cache) <= held + 8
        assert warm[0].ids.tolist() == ref.encode(text).ids
    assert answered > 10
    from rose.ascii_bpe import taken

    for text in texts:  # every piece known now: each text the path takes is answered, with the same ids
        warm = tok.encode_warm([text], max_new=0)
        assert (warm is not None) == (taken(text) and "<|" not in text), repr(text)
        assert warm is None or warm[0].ids.tolist() == ref.encode(text).ids
    prose = "".join(c for c in CORPUS[:16_000] if taken(c))[:15_000]
    assert tok.encode_warm([prose], max_new=8) is None  # too many new pieces
    for _ in range(50):  # encode_batch learns them (a bounded share a call while most are new)
        tok.encode_batch([prose])
        if tok.encode_warm([prose], max_new=0) is not None:
            break
    warm = tok.encode_warm([prose, prose[:99]], max_length=50, side="left")
    assert [e.ids.tolist() for e in warm] == [e.ids for e in tok.encode_batch([prose, prose[:99]], 50, "left")]
    assert warm[0].truncated and warm[0].original_length == len(ref.encode(prose).ids)
    assert tok.encode_warm([CORPUS[:25_000]]) is None, "over bpe_whole_chars: cut in pieces instead"
    held, words = len(tok.word_cache), tok.word_cache.words
    assert tok.encode_warm([prose + " zebra quokka", "café"]) is None, "one text for the plain path takes the call"
    long_new = " ".join(f"q{i}" * 50 for i in range(3))  # three new words of 100 characters
    assert tok.encode_warm([long_new], max_new=8, max_new_chars=200) is None
    assert (len(tok.word_cache), tok.word_cache.words) == (held, words), "refused: nothing learned or counted"
    assert tok.encode_warm([long_new], max_new=8, max_new_chars=1000) is not None


def test_chunks_cut_before_every_space_followed_by_a_visible_character_and_nowhere_else() -> None:
    """rose.ascii_bpe.chunks: the chunks' texts joined give the text back, and the cuts are exactly before the
    spaces followed by a visible character, however the spaces, tabs, newlines and carriage returns run (that the
    ids are the same is test_ids_equal_the_tokenizers_own's, on the same kind of texts)."""
    from rose.ascii_bpe import chunk_text, chunks, taken

    rng = random.Random(7)
    texts = [random_ascii(rng) for _ in range(4000)] + [CORPUS[i:i + 900] for i in range(0, 90_000, 3000)]
    texts += ["", " ", "  ", "x", " x", "x ", " x ", "a  b", "a   b", "a \n b", "\n  x", "x  \n", "a\t b", "a \tb",
              "a \r\n b", "a b  c   d    e", "   ", " \n ", "a\n \nb", "    def f():\n        return 1\n"]
    kept = [t for t in texts if taken(t)]
    assert len(kept) > 600
    for text in kept:
        parts = [chunk_text(c) for c in chunks(text)]
        assert "".join(parts) == text, repr(text)
        cuts, at = set(), 0
        for p in parts[:-1]:
            at += len(p)
            cuts.add(at)
        want = {i for i in range(len(text) - 1) if text[i] == " " and text[i + 1] not in " \t\n\r"}
        assert cuts - {0} == want - {0} and all(p for p in parts[1:]), repr(text)
