"""rose.word_cache: a BERT tokenizer's ASCII texts encoded word by word from remembered ids give exactly the ids of
`tokenizers` itself (specials, truncation from either side, counts), however full the cache, from several
threads at once; only BertNormalizer(clean_text) + BertPreTokenizer + WordPiece qualifies; a long ASCII text is
encoded whole, not in pieces."""

from __future__ import annotations

import json
import random
import shutil
import threading

import pytest

from ivy.split_encode import SplitEncoder
from rose.ascii_bert import words_by_offsets
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer
from rose.word_cache import MAX_WORD_CHARS, WordCache
from tests.rose.test_rose_ascii_bert import random_ascii, reference


def bundled(cache_words: int = 1 << 16) -> Tokenizer:
    return Tokenizer(load_spec(bundled_model_dir()), cache_words=cache_words)


def each(tok: Tokenizer, texts: list[str], **kwargs) -> list:
    """encode_batch in calls of four texts, as requests bring them: a call of a thousand new texts would take the
    plain path (rose.word_cache.LEARN_PER_CALL), and the cache's own path would go untested."""
    return [e for i in range(0, len(texts), 4) for e in tok.encode_batch(texts[i:i + 4], **kwargs)]


def lists(arrays) -> list[list[int]]:
    """WordCache's int32 arrays as lists, to compare with `tokenizers`' ids."""
    return [a.tolist() for a in arrays]


def texts_of(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    out = [random_ascii(rng) for _ in range(n)]
    out += ["x" * (MAX_WORD_CHARS + 1), "y" * 101 + " z", "a " * 300, "", "   ", "Hello,world!! (x86_64) ##ing"]
    return out


def test_ids_equal_the_tokenizers_own_with_specials_and_counts() -> None:
    ours = bundled()
    assert ours._ascii.words is not None
    ref = reference(ours)
    texts = texts_of(1, 1500)
    want = [e.ids for e in ref.encode_batch(texts)]
    for _ in range(2):  # the first pass fills the cache, the second reads it
        got = [e.ids for e in each(ours, texts, max_length=10**6)]
        for text, g, w in zip(texts, got, want):
            assert g == w, repr(text)
    assert len(ours.word_cache) > 500
    assert ours.count_tokens(texts) == [len(w) for w in want]


@pytest.mark.parametrize("side", ["right", "left"])
def test_truncation_from_either_side_as_the_plain_path(side) -> None:
    ours, plain = bundled(), bundled(cache_words=0)
    assert plain._ascii.words is None
    texts = texts_of(2, 300)
    for limit in (3, 8, 40):
        assert each(ours, texts, max_length=limit, side=side) == plain.encode_batch(texts, max_length=limit, side=side)


def test_a_small_cache_starts_again_and_stays_exact() -> None:
    ours = bundled(cache_words=7)
    ref = reference(ours)
    texts = texts_of(3, 400)
    for text in texts:
        assert ours.encode(text, max_length=10**6).ids == ref.encode(text).ids, repr(text)
        assert len(ours._ascii.words) <= 7


def spied_cache() -> tuple[WordCache, list[list[str]], Tokenizer]:
    """A WordCache over the bundled tokenizer's bare encode, the words of each encode call it makes, the tokenizer."""
    calls: list[list[str]] = []
    tok = bundled()
    bare = tok._ascii.bare

    def encode(texts):
        calls.append([w for t in texts for w in t.split(" ")])
        return bare.encode_batch(texts, add_special_tokens=False)

    return WordCache(words_by_offsets(encode)), calls, tok


def test_known_words_are_not_encoded_again_and_long_ones_not_remembered() -> None:
    cache, calls, tok = spied_cache()
    bare = tok._ascii.bare
    long_word = "q" * (MAX_WORD_CHARS + 1)
    first = lists(cache.content_ids(["hello world, hello", long_word]))
    assert sorted(calls[0]) == sorted(["hello", "world,", long_word])  # the new words, once each, in one call
    assert first == [bare.encode("hello world, hello", add_special_tokens=False).ids,
                     bare.encode(long_word, add_special_tokens=False).ids]
    assert lists(cache.content_ids(["world, hello hello"])) == [first[0][1:3] + first[0][:1] * 2]
    assert len(calls) == 1  # every word known: no call
    cache.content_ids([long_word])
    assert calls[1] == [long_word]  # too long to remember
    assert (cache.words, cache.new) == (4 + 3 + 1, 3 + 1)  # words looked up, the distinct new ones encoded


def test_threads_sharing_a_cache_that_keeps_emptying_get_exact_ids() -> None:
    ours = bundled(cache_words=50)
    ref = reference(ours)
    errors: list[str] = []

    def work(seed: int) -> None:
        texts = texts_of(seed, 150)
        want = [e.ids for e in ref.encode_batch(texts)]
        for _ in range(3):
            got = [e.ids for e in each(ours, texts, max_length=10**6)]
            errors.extend(repr(t) for t, g, w in zip(texts, got, want) if g != w)

    threads = [threading.Thread(target=work, args=(10 + i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_mixed_call_keeps_its_order() -> None:
    ours = bundled()
    ref = reference(ours)
    texts = ["Café au lait", "plain ascii", "東京 tower", "Another ONE", "naïve [SEP] x", "x [SEP] y", "ok"]
    assert [e.ids for e in ours.encode_batch(texts, max_length=10**6)] == [e.ids for e in ref.encode_batch(texts)]


def _folder(tmp_path, edit) -> Tokenizer:
    out = tmp_path / "model"
    shutil.copytree(bundled_model_dir(), out)
    data = json.loads((out / "tokenizer.json").read_text())
    edit(data)
    (out / "tokenizer.json").write_text(json.dumps(data))
    return Tokenizer(load_spec(out))


@pytest.mark.parametrize("edit", [
    lambda d: d["normalizer"].update(clean_text=False),  # control characters would stay: str.split differs
    lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [{"type": "BertPreTokenizer"}]}),
    lambda d: d.update(pre_tokenizer={"type": "Whitespace"}),
])
def test_only_the_exact_bert_pipeline_qualifies(tmp_path, edit) -> None:
    tok = _folder(tmp_path, edit)
    assert tok._ascii is not None and tok._ascii.words is None
    assert not tok.takes_whole("plain ascii")
    ref = reference(tok)
    texts = texts_of(4, 200)
    assert [e.ids for e in tok.encode_batch(texts, max_length=10**6)] == [e.ids for e in ref.encode_batch(texts)]


def test_a_long_ascii_text_is_encoded_whole_and_others_still_in_pieces() -> None:
    from concurrent.futures import ThreadPoolExecutor

    tok, plain = bundled(), bundled(cache_words=0)
    long_ascii = "The gateway tokenizes each request, then Tulip packs it. " * 200
    long_other = "Café, naïve façade. " * 400
    with ThreadPoolExecutor(4) as pool:
        ours = SplitEncoder(tok, pool, threads=4, split_chars=1000, piece_chars=500)
        theirs = SplitEncoder(plain, pool, threads=4, split_chars=1000, piece_chars=500)
        assert ours.pieces(long_ascii) is None and theirs.pieces(long_ascii) is not None
        assert ours.pieces(long_other) is not None
        for side in ("right", "left"):
            assert ours.encode_batch([long_ascii, long_other, "short"], max_length=512, side=side) == \
                plain.encode_batch([long_ascii, long_other, "short"], max_length=512, side=side)


def test_a_long_text_the_cache_refuses_is_cut_in_pieces_after_all() -> None:
    """A long ASCII text goes whole to the word cache; when the cache refuses it (mostly new words: the plain path
    would encode it whole on one thread), it is cut in pieces like a text the cache never takes, with the same ids."""
    from concurrent.futures import ThreadPoolExecutor

    tok, plain = bundled(), bundled(cache_words=0)
    rng = random.Random(12)
    fresh = " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randrange(3, 10)))
                     for _ in range(800))  # ~5 000 characters of words never seen
    units: list[int] = []
    real = tok.content_encodings
    tok.content_encodings = lambda texts: (units.append(len(texts)), real(texts))[1]
    with ThreadPoolExecutor(4) as pool:
        ours = SplitEncoder(tok, pool, threads=4, split_chars=1000, piece_chars=500)
        assert ours.pieces(fresh) is None, "the cache takes it whole"
        for arrays in (False, True):
            got = ours.encode_batch([fresh, "short"], max_length=10**6, arrays=arrays)
            assert [list(e.ids) for e in got] == [e.ids for e in plain.encode_batch([fresh, "short"], max_length=10**6)]
        assert units == [5, 5], "refused both times, then cut: four pieces and the short text, in one call"


def test_a_word_two_threads_learn_at_once_is_counted_once() -> None:
    """Two threads that both found a word new remember it twice: the ids held count it once (an over-count
    emptied a cache less than half full)."""
    barrier = threading.Barrier(2)

    def encode(words):
        barrier.wait(timeout=10)
        return [tuple(range(5)) for _ in words]

    cache = WordCache(encode, capacity=4)
    for word in ("w0", "w1", "w2"):
        threads = [threading.Thread(target=cache.content_ids, args=([word],)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(cache) == 3 and cache._held == 15


def test_a_long_text_in_a_call_over_cache_call_chars_is_cut_too() -> None:
    """A call over cache_call_chars skips the cache; its long text the splitter left whole for the cache is cut in
    pieces there (one thread for ~30 000 characters, else)."""
    from concurrent.futures import ThreadPoolExecutor

    tok, plain = bundled(), bundled(cache_words=0)
    rng = random.Random(13)
    long_text = " ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randrange(3, 9))) for _ in range(5000))
    texts = [long_text, "y " * 2000]
    assert sum(map(len, texts)) > tok.cache_call_chars
    units: list[int] = []
    real = tok.content_encodings
    tok.content_encodings = lambda some: (units.append(len(some)), real(some))[1]
    with ThreadPoolExecutor(8) as pool:
        got = SplitEncoder(tok, pool, threads=8, split_chars=1000, piece_chars=500).encode_batch(texts, 10**6)
    assert [e.ids for e in got] == [e.ids for e in plain.encode_batch(texts, 10**6)]
    assert units == [8 + 1], "the long text in eight pieces beside the other, in one call"


def test_words_known_when_a_call_began_are_not_encoded_again_when_it_empties_the_cache() -> None:
    bare = bundled()._ascii.bare
    calls: list[list[str]] = []

    def encode(texts):
        calls.append(sorted(w for t in texts for w in t.split(" ")))
        return bare.encode_batch(texts, add_special_tokens=False)

    cache = WordCache(words_by_offsets(encode), capacity=3)
    cache.content_ids(["alpha beta gamma"])
    # Two new words do not fit beside three: the cache starts again with them; alpha and beta, known when the call
    # began, are gone from it, but their ids were read before: they are not encoded again.
    assert lists(cache.content_ids(["alpha beta delta epsilon"])) == [bare.encode("alpha beta delta epsilon",
                                                                                  add_special_tokens=False).ids]
    assert calls[1:] == [["delta", "epsilon"]]
    assert sorted(cache._ids) == ["delta", "epsilon"]


def test_a_warm_call_that_fills_the_cache_encodes_only_its_new_words() -> None:
    """encode_warm runs on the event loop, bounded to max_new new words: a call whose few new words overflow a full
    cache (it starts again empty) must not encode its known words again, on the loop, with them."""
    tok = bundled(cache_words=40)
    cache = tok.word_cache
    encoded: list[str] = []
    real = cache._encode_words
    cache._encode_words = lambda new: encoded.extend(new) or real(new)
    known = " ".join(f"known{i}" for i in range(30))
    tok.encode_batch([known])  # 30 words remembered
    text = known + " " + " ".join(f"fresh{i}" for i in range(15))  # 15 new words: 45 do not fit in 40
    encoded.clear()
    warm = tok.encode_warm([text], max_new=20)
    assert warm is not None and warm[0].ids.tolist() == reference(tok).encode(text).ids
    assert sorted(encoded) == sorted(f"fresh{i}" for i in range(15)), "only the call's new words, once"


def _with_added(tmp_path, tokens) -> tuple[Tokenizer, object]:
    from tokenizers import Tokenizer as HFTokenizer

    out = tmp_path / "model"
    shutil.copytree(bundled_model_dir(), out)
    hf = HFTokenizer.from_file(str(out / "tokenizer.json"))
    hf.add_tokens(tokens)
    hf.save(str(out / "tokenizer.json"))
    tok = Tokenizer(load_spec(out))
    return tok, reference(tok)


@pytest.mark.parametrize("token", [("hello world", True), ("hello world", False), ("[new line]", True),
                                   ("\t", False), ("Café", True), ("x\x00y", True)])
def test_an_added_token_the_text_search_cannot_rule_out_turns_the_ascii_path_off(tmp_path, token) -> None:
    from tokenizers import AddedToken

    tok, ref = _with_added(tmp_path, [AddedToken(token[0], normalized=token[1])])
    assert tok._ascii is None and tok.word_cache is None
    texts = ["hello", "world", "hello  world", "world hello", "a\tb", "cafe au lait", "a xy b", "[new line]"] * 2
    assert [e.ids for e in each(tok, texts, max_length=10**6)] == [e.ids for e in ref.encode_batch(texts)]


def test_a_plain_added_token_keeps_the_cache_and_sends_its_texts_the_plain_way(tmp_path) -> None:
    from tokenizers import AddedToken

    tok, ref = _with_added(tmp_path, [AddedToken("<doc>", normalized=False), AddedToken("Zeta9", normalized=True)])
    assert tok.word_cache is not None
    texts = texts_of(5, 300) + ["a <doc> b", "x zeta9 y", "ZETA9", "<DOC>", "<do c>"]
    for _ in range(2):
        assert [e.ids for e in each(tok, texts, max_length=10**6)] == [e.ids for e in ref.encode_batch(texts)]
    assert len(tok.word_cache) > 100


def test_long_words_are_not_remembered_and_words_of_many_ids_are() -> None:
    """A word of many ids ("-" * 38 under a heading: 38 ids) is remembered like any other, so a text holding one
    is looked up whole the next time; a word over MAX_WORD_CHARS is not, and its text still comes back exact."""
    cache, calls, tok = spied_cache()
    many_ids, long_word = "-" * 38, "a" * (MAX_WORD_CHARS + 1)
    texts = ["plain", f"heading {many_ids} text", long_word, "x," * (MAX_WORD_CHARS // 2)]
    want = [e.ids for e in reference(tok).encode_batch(texts, add_special_tokens=False)]
    assert lists(cache.content_ids(texts)) == want
    assert sorted(cache._ids) == sorted(["plain", "heading", many_ids, "text", "x," * (MAX_WORD_CHARS // 2)])
    assert lists(cache.content_ids(texts[:2])) == want[:2] and len(calls) == 1  # all known: no call
    assert lists(cache.content_ids(texts)) == want and calls[1:] == [[long_word]]


def test_the_ids_held_are_bounded_as_well_as_the_words() -> None:
    """A client sending words of many ids fills the cache's id budget (capacity × IDS_PER_WORD) before its word
    count: the cache starts again, and every answer stays exact."""
    from rose.word_cache import IDS_PER_WORD

    tok = bundled()
    cache = WordCache(words_by_offsets(lambda t: tok._ascii.bare.encode_batch(t, add_special_tokens=False)),
                      capacity=20)
    ref = reference(tok)
    for i in range(40):
        text = f"{'x,' * 20}{i} ok"  # one word of 42 ids or so, and "ok"
        assert lists(cache.content_ids([text])) == [ref.encode(text, add_special_tokens=False).ids]
        assert cache._held <= 20 * IDS_PER_WORD + 50 and len(cache) <= 20


def test_a_call_of_mostly_new_words_takes_the_plain_path_and_learns_a_bounded_share() -> None:
    from rose.word_cache import LEARN_PER_CALL

    tok = bundled()
    ref = reference(tok)
    rng = random.Random(8)
    text = " ".join("".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randrange(3, 9)))
                    for _ in range(3 * LEARN_PER_CALL))
    assert tok.encode_batch([text], max_length=10**6)[0].ids == ref.encode(text).ids
    assert len(tok.word_cache) <= LEARN_PER_CALL and tok.word_cache.new == LEARN_PER_CALL
    words = text.split()
    known = " ".join(words[:LEARN_PER_CALL // 4])  # a call of fewer new words is learned whole
    assert tok.encode_batch([known], max_length=10**6)[0].ids == ref.encode(known).ids


@pytest.mark.parametrize("variant", [{"lowercase": False}, {"strip_accents": True, "handle_chinese_chars": False},
                                     {"strip_accents": False}])
def test_normalizer_variants_through_the_cache(tmp_path, variant) -> None:
    tok = _folder(tmp_path, lambda d: d["normalizer"].update(variant))
    assert tok.word_cache is not None
    ref = reference(tok)
    texts = texts_of(6, 1000)
    want = [e.ids for e in ref.encode_batch(texts)]
    for _ in range(2):
        assert [e.ids for e in each(tok, texts, max_length=10**6)] == want
    assert len(tok.word_cache) > 500


def test_a_call_over_cache_call_chars_goes_to_tokenizers_with_the_same_ids() -> None:
    """A bulk request's texts (more characters in all than cache_call_chars) skip the cache, whose Python lookups
    would hold the GIL for milliseconds; its ids are the same, and a text over the bound is cut in pieces again."""
    from concurrent.futures import ThreadPoolExecutor

    tok = Tokenizer(load_spec(bundled_model_dir()), cache_call_chars=2000)
    texts = [f"document {i} of a bulk batch, each a few words long, indexed for search" for i in range(40)]
    assert sum(map(len, texts)) > 2000
    small = texts[:4]
    tok.encode_batch(small)
    words = tok.word_cache.words
    assert tok.encode_batch(texts) == bundled(cache_words=0).encode_batch(texts)
    assert tok.word_cache.words == words, "the large call did not go through the cache"
    tok.encode_batch(small)
    assert tok.word_cache.words > words, "a small call still does"
    long_ascii = "The gateway tokenizes each request, then Tulip packs it. " * 50
    assert not tok.takes_whole(long_ascii) and bundled().takes_whole(long_ascii)
    with ThreadPoolExecutor(4) as pool:
        assert SplitEncoder(tok, pool, threads=4, split_chars=1000, piece_chars=500).pieces(long_ascii) is not None
    assert Tokenizer(load_spec(bundled_model_dir()), cache_call_chars=0).takes_whole(long_ascii * 20)
