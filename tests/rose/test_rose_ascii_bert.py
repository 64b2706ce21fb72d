"""rose.ascii_bert: BERT's normalizer done in Python on ASCII text gives exactly the ids of `tokenizers` itself,
on random ASCII (control characters, every whitespace, case, punctuation, added tokens' text), for the bundled
all-MiniLM-L6-v2 and for variants of its normalizer; other normalizers and non-ASCII text take the plain path."""

from __future__ import annotations

import json
import random
import shutil

import pytest
from tokenizers import Tokenizer as HFTokenizer

from rose.ascii_bert import AddedTexts, AsciiBert
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer

WORDS = ["hello", "World", "EMBEDDING", "server's", "naive", "don't", "[SEP]", "[sep]", "[Mask]", "[CLS]x",
         "##ing", "U.S.A.", "e-mail", "3.14", "x86_64", "<b>", "a\u0000b", "tab\there", "cr\rlf\n", "\x0b\x0c\x1c\x7f"]


def random_ascii(rng: random.Random) -> str:
    if rng.random() < 0.3:  # any of the 128 characters
        return "".join(chr(rng.randrange(128)) for _ in range(rng.randrange(0, 80)))
    return rng.choice(["", " ", "\n"]).join(rng.choice(WORDS + [" ", "  ", "\t", "!", "?!", "--", "\x01"])
                                             for _ in range(rng.randrange(0, 40)))


def folder(tmp_path, **normalizer) -> Tokenizer:
    """The bundled model with its normalizer's fields changed (a BertNormalizer still, unless `type` says)."""
    out = tmp_path / "model"
    shutil.copytree(bundled_model_dir(), out)
    data = json.loads((out / "tokenizer.json").read_text())
    data["normalizer"].update(normalizer)
    (out / "tokenizer.json").write_text(json.dumps(data))
    return Tokenizer(load_spec(out))


def reference(tok: Tokenizer) -> HFTokenizer:
    ref = HFTokenizer.from_file(str(tok.spec.model_dir / "tokenizer.json"))
    ref.no_truncation()
    ref.no_padding()
    return ref


@pytest.mark.parametrize("variant", [{}, {"lowercase": False}, {"clean_text": False},
                                     {"strip_accents": True, "handle_chinese_chars": False}])
def test_ascii_ids_equal_the_tokenizers_own(tmp_path, variant) -> None:
    ours = folder(tmp_path, **variant) if variant else Tokenizer(load_spec(bundled_model_dir()))
    assert ours._ascii is not None
    ref = reference(ours)
    rng = random.Random(len(json.dumps(variant)))
    texts = [random_ascii(rng) for _ in range(1500)]
    got = [e.ids for e in ours.content_encodings(texts)]
    want = [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]
    for text, g, w in zip(texts, got, want):
        assert g == w, repr(text)
    assert [e.ids for e in ours.encode_batch(texts[:50], max_length=10**6)] == \
        [e.ids for e in ref.encode_batch(texts[:50])]


def test_a_mixed_call_keeps_its_order_and_non_ascii_takes_the_plain_path() -> None:
    ours = Tokenizer(load_spec(bundled_model_dir()))
    ref = reference(ours)
    texts = ["Café au lait", "plain ascii", "東京 tower", "Another ONE", "naïve [SEP] x", "x [SEP] y"]
    assert [ours._ascii.normalized(t) for t in texts] == [None, "plain ascii", None, "another one", None, None]
    assert [e.ids for e in ours.content_encodings(texts)] == \
        [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]


def test_only_a_bert_normalizer_qualifies(tmp_path) -> None:
    assert folder(tmp_path, type="Lowercase")._ascii is None  # extra fields too: not exactly BertNormalizer's
    raw = HFTokenizer.from_file(str(bundled_model_dir() / "tokenizer.json"))
    data = json.loads(raw.to_str())
    data["normalizer"] = {"type": "Lowercase"}
    assert AsciiBert.of(HFTokenizer.from_str(json.dumps(data))) is None


def test_added_texts_finds_what_a_search_of_the_lowercased_text_finds() -> None:
    """The search gated by first characters answers as a search for every token in the lowercased text: tokens that
    start with a letter (either case in the text), with punctuation, sharing a first character, or repeated."""
    added = ["[SEP]", "[mask]", "<|im_start|>", "<think>", "Foo", "bar", "BAR", "x", ""]
    finder = AddedTexts(added)
    lowered = [a.lower() for a in added if a]
    rng = random.Random(3)
    pool = ["[sep]", "[SeP]", "<|IM_START|>", "<think", "think>", "fOO", "Ba", "r", "X", "<", "[", " ", "b", "ar"]
    for _ in range(3000):
        text = "".join(rng.choice(pool) for _ in range(rng.randrange(0, 6)))
        want = any(a in text.lower() for a in lowered)
        assert finder.found(text) == want, text
        assert finder.found(text, text.lower()) == want, text
    assert not AddedTexts([]) and not AddedTexts([]).found("[SEP] <think>")
