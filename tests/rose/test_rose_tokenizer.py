"""ROSE's tokenizer wrapper against `tokenizers` itself: ids with special tokens, truncation from either
side keeping the specials, exact original lengths (the fast path without offsets must change nothing)."""

from __future__ import annotations

from tokenizers import Tokenizer as HFTokenizer

from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer

TEXTS = ["hello world", "Ünïcødé, emoji 🚀 and accents: café, naïve, 東京.", "", "word " * 300,
         "The quick brown fox jumps over the lazy dog. " * 20]


def test_ids_and_truncation_match_the_reference_tokenizer() -> None:
    spec = load_spec(bundled_model_dir())
    ours = Tokenizer(spec)
    ref = HFTokenizer.from_file(str(spec.model_dir / "tokenizer.json"))
    ref.no_padding()
    ref.no_truncation()
    for text in TEXTS:
        full = ref.encode(text).ids  # [CLS] ... [SEP]
        got = ours.encode(text, max_length=10**6)
        assert got.ids == full and got.original_length == len(full) and not got.truncated
        for side in ("right", "left"):
            cut = ours.encode(text, max_length=12, side=side)
            body = full[1:-1][:10] if side == "right" else full[1:-1][-10:]
            expected = [full[0], *body, full[-1]] if len(full) > 12 else full
            assert cut.ids == expected and cut.truncated == (len(full) > 12), (text[:20], side)
    assert ours.count_tokens(TEXTS) == [len(ref.encode(t).ids) for t in TEXTS]


def test_decode_is_the_tokenizers_own_and_keeps_special_tokens_on_request() -> None:
    spec = load_spec(bundled_model_dir())
    ours = Tokenizer(spec)
    ref = HFTokenizer.from_file(str(spec.model_dir / "tokenizer.json"))
    for text in TEXTS:
        ids = ours.encode(text, max_length=10**6).ids
        assert ours.decode(ids) == ref.decode(ids)
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids, skip_special_tokens=False)
    assert ours.decode(ours.encode("hello world").ids, skip_special_tokens=False) == "[CLS] hello world [SEP]"


def test_sentencepiece_decode_maps_fairseq_ids_back(tiny_spm) -> None:
    import sentencepiece as spm

    from rose_tiny_models import WORDS

    ours = Tokenizer(load_spec(tiny_spm.path))
    sp = spm.SentencePieceProcessor(model_file=str(tiny_spm.path / "sentencepiece.bpe.model"))
    text = " ".join(WORDS[:6])
    ids = ours.encode(text).ids  # <s> pieces (+1) </s>
    plain = sp.decode(sp.encode(text))
    assert ids[0] == 0 and ids[-1] == 2 and ours.decode(ids) == plain
    assert ours.decode(ids, skip_special_tokens=False) == f"<s> {plain}</s>"  # as Metaspace decodes after <s>
    assert ours.decode([*ids[:-1], ours.vocab_size - 1], skip_special_tokens=False) == f"<s> {plain}<mask>"

    unk_between = [*ids[:-1][:3], 3, *ids[3:]]  # <unk> inside the text: skipping it keeps the next word's space
    words = plain.split(" ")
    assert ours.decode(unk_between) == sp.decode([i - 1 for i in unk_between if i > 3])
    assert ours.decode(unk_between, skip_special_tokens=False).startswith("<s> " + " ".join(words[:2]))


def test_sentencepiece_without_bos_adds_no_minus_one(tmp_path) -> None:
    """A SentencePiece model trained without <s> (bos_id -1, as T5's): no id -1 around the content."""
    import io

    import sentencepiece as spm

    from rose.spm_tokenizer import SentencePieceTokenizer as _SentencePiece

    buf = io.BytesIO()
    lines = [f"the quick brown fox {i} jumps over the lazy dog" for i in range(100)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=40,
                                   model_type="unigram", bos_id=-1, minloglevel=2)
    (tmp_path / "spiece.model").write_bytes(buf.getvalue())
    sp = _SentencePiece(tmp_path / "spiece.model", fairseq=False)
    enc = sp.encode("the quick fox", keep=100, side="right")
    assert min(enc.ids) >= 0 and enc.ids[-1] == sp.eos and sp.head == []
    assert enc.original_length == len(enc.ids) and not enc.truncated
    pair = sp.encode_pair("the fox", "lazy dog", 100, "right")
    assert min(pair.ids) >= 0 and pair.ids.count(sp.eos) == 3 and pair.original_length == len(pair.ids)
    assert sp.decode(pair.ids, False)  # every id decodes
