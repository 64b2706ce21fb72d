"""ROSE's tokenizer wrapper against `tokenizers` itself: ids with special tokens, truncation from either
side keeping the specials, exact original lengths (the fast path without offsets must change nothing)."""

from __future__ import annotations

import json
import shutil

import pytest
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



def test_sentencepiece_ids_equal_transformers_with_special_tokens_in_the_text(tiny_spm) -> None:
    """A text holding "<mask>", "<pad>", "<s>"... gets those tokens' ids, as transformers' XLM-R tokenizer (what
    sentence-transformers runs on such a folder) matches them; the whitespace around them as it cuts it."""
    transformers = pytest.importorskip("transformers")
    from rose_tiny_models import WORDS

    ref = transformers.AutoTokenizer.from_pretrained(str(tiny_spm.path))
    ours = Tokenizer(load_spec(tiny_spm.path))
    words = " ".join(WORDS[:4])
    texts = [words, f"{words} <mask> fox", f"<s>{words}</s>", "a <pad> dog<unk>", "<mask>", " <pad>  <mask> ",
             f"{words}\t <mask>\u3000fox\u00a0dog", "<s></s><pad>", "<mask"]
    for text in texts:
        assert ours.encode(text).ids == ref(text)["input_ids"], text
    ref.truncation_side = "left"
    cut = ours.encode(f"{words} <mask> <mask> <mask>", max_length=6, side="left").ids
    assert cut == ref(f"{words} <mask> <mask> <mask>", truncation=True, max_length=6)["input_ids"]


def _do_lower_case(src, dst, cased: bool):
    """A copy of the folder `src` whose sentence_bert_config.json sets do_lower_case; cased: its BERT tokenizer
    made cased first (tokenizer.json's normalizer and tokenizer_config.json, which transformers reads, agree)."""
    shutil.copytree(src, dst)
    if cased:
        data = json.loads((dst / "tokenizer.json").read_text())
        data["normalizer"]["lowercase"] = False
        (dst / "tokenizer.json").write_text(json.dumps(data))
        config = json.loads((dst / "tokenizer_config.json").read_text())
        (dst / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": False}))
    sbert = json.loads((dst / "sentence_bert_config.json").read_text())
    (dst / "sentence_bert_config.json").write_text(json.dumps({**sbert, "do_lower_case": True}))
    return dst


def test_do_lower_case_lowercases_the_texts_as_sentence_transformers(tiny_root, tiny_spm, tmp_path) -> None:
    """sentence_bert_config.json's do_lower_case: sentence-transformers puts a Lowercase before the tokenizer's
    normalizer (a cased BERT's, a SentencePiece model's); ROSE's ids are its ids, the word cache's too."""
    st = pytest.importorskip("sentence_transformers")
    from rose_tiny_models import build_bert

    bert = _do_lower_case(build_bert(tiny_root, "bert", "mean", seed=0).path, tmp_path / "bert", cased=True)
    spm = _do_lower_case(tiny_spm.path, tmp_path / "spm", cased=False)
    texts = ["Hello World", "The QUICK brown Fox jumps", "Ünïcødé Café ΑΣ İ", "<mask> The <s>FOX</s>", ""]
    for folder in (bert, spm):
        ref = st.SentenceTransformer(str(folder), device="cpu").tokenizer
        ours = Tokenizer(load_spec(folder))
        for _ in range(2):  # the word cache cold, then warm
            assert [list(e.ids) for e in ours.encode_batch(texts)] == [ref(t)["input_ids"] for t in texts], folder.name

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
